//! The anchors GitHub derives from a Markdown file's headings (lower case,
//! punctuation other than `-` and `_` dropped, spaces to `-`): what
//! `docs/guide/tuning.md#<anchor>` links resolve to. Used by the tests that
//! check every anchor doctor prints is a section of the guide (the unit
//! tests, and tests/doctor.rs through `#[path]`).

pub fn github_anchors(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}
