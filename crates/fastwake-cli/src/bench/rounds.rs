//! The one round-interleaving schedule of `bench pingpong|ipc|share|load`
//! and `bench lanes`.
//!
//! These machines are noisy: a slow second ruins whichever case runs in
//! it. So a run is cut into rounds and every round gives each case one
//! turn; a noisy second is spread over all cases instead of ruining one,
//! and ratios between rows hold even when absolute figures drift.
//!
//! The order within a round follows a Williams design (a balanced Latin
//! square, as crossover trials use against carry-over): over `n` rounds
//! (`2n` for an odd number of cases) every case runs in every position
//! equally often and right after every other case equally often. A case
//! whose turn leaves the machine in some state (a thread that spun to the
//! end of its turn and starts the next one behind in the scheduler's
//! fairness, a helper that polls on into the next turn) then weighs on
//! every other case alike instead of always on the same neighbour. A
//! plain rotation of the starting case would not do that: it keeps every
//! case right after the same one in all but one round in `n`.

/// How `cases` cases share `total` units of work (iterations, or ns of
/// measured time) each, over `rounds` rounds.
#[derive(Debug, Clone, Copy)]
pub struct Rounds {
    cases: usize,
    rounds: u64,
    total: u64,
}

/// One case's turn in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// 0-based round.
    pub round: u64,
    /// Index of the case.
    pub case: usize,
    /// Its share of `total` in this round.
    pub amount: u64,
}

impl Rounds {
    pub fn new(cases: usize, rounds: u64, total: u64) -> Rounds {
        Rounds {
            cases,
            rounds,
            total,
        }
    }

    /// Rounds in one period of [`order`]'s design for `cases` cases: `n`
    /// for an even number, `2n` for an odd one.
    pub fn period(cases: usize) -> u64 {
        if cases.is_multiple_of(2) {
            cases
        } else {
            2 * cases
        }
        .max(1) as u64
    }

    /// Every turn, round by round, in [`order`]'s order.
    pub fn turns(self) -> impl Iterator<Item = Turn> {
        (0..self.rounds).flat_map(move |round| {
            let amount = self.amount(round);
            order(self.cases, round).into_iter().map(move |case| Turn {
                round,
                case,
                amount,
            })
        })
    }

    /// Each case's share in `round`: equal shares, the first
    /// `total % rounds` rounds one more, so the shares sum to `total`.
    fn amount(&self, round: u64) -> u64 {
        self.total / self.rounds + u64::from(round < self.total % self.rounds)
    }
}

/// The cases' order in `round`: row `round` of a Williams design for
/// `cases` cases. Row 0 is 0, 1, n−1, 2, n−2, …; row r adds r to each
/// (mod n); for an odd n, rows n to 2n−1 are rows 0 to n−1 reversed. Row
/// 0 starts with case 0.
pub fn order(cases: usize, round: u64) -> Vec<usize> {
    let n = cases;
    if n == 0 {
        return Vec::new();
    }
    let r = (round % Rounds::period(n)) as usize;
    let first = (0..n).map(|j| {
        if j % 2 == 1 {
            j.div_ceil(2)
        } else {
            (n - j / 2) % n
        }
    });
    let mut row: Vec<usize> = first.map(|a| (a + r) % n).collect();
    if r >= n {
        row.reverse();
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order_of(r: Rounds, round: u64) -> Vec<usize> {
        r.turns()
            .filter(|t| t.round == round)
            .map(|t| t.case)
            .collect()
    }

    #[test]
    fn the_first_rounds_of_four_cases() {
        let r = Rounds::new(4, 5, 100);
        assert_eq!(order_of(r, 0), [0, 1, 3, 2]);
        assert_eq!(order_of(r, 1), [1, 2, 0, 3]);
        assert_eq!(order_of(r, 2), [2, 3, 1, 0]);
        assert_eq!(order_of(r, 3), [3, 0, 2, 1]);
        assert_eq!(order_of(r, 4), [0, 1, 3, 2], "the design repeats");
        let three = Rounds::new(3, 6, 100);
        assert_eq!(order_of(three, 0), [0, 1, 2]);
        assert_eq!(order_of(three, 3), [2, 1, 0], "odd: the rows reversed");
    }

    #[test]
    fn a_period_is_n_rounds_or_2n_for_odd_n() {
        let p: Vec<u64> = (0..8).map(Rounds::period).collect();
        assert_eq!(p, [1, 2, 2, 6, 4, 10, 6, 14]);
    }

    /// Over one period every case takes every position equally often and
    /// follows every other case equally often: the balance a rotation of
    /// the start lacks (it fails the second count for 3 cases or more).
    #[test]
    fn a_period_balances_positions_and_predecessors() {
        for n in 1..=9usize {
            let period = Rounds::period(n);
            let mut at = vec![vec![0u32; n]; n];
            let mut after = vec![vec![0u32; n]; n];
            for round in 0..period {
                let row = order(n, round);
                let mut sorted = row.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..n).collect::<Vec<_>>(),
                    "{n} cases, round {round}"
                );
                for (pos, &c) in row.iter().enumerate() {
                    at[c][pos] += 1;
                }
                for w in row.windows(2) {
                    after[w[1]][w[0]] += 1;
                }
            }
            let per_position = (period / n as u64) as u32;
            assert!(
                at.iter().flatten().all(|&k| k == per_position),
                "{n}: {at:?}"
            );
            let per_pair = if n < 2 {
                0
            } else {
                (period as u32 * (n as u32 - 1)) / (n as u32 * (n as u32 - 1))
            };
            for (c, row) in after.iter().enumerate() {
                for (p, &k) in row.iter().enumerate() {
                    let want = if c == p { 0 } else { per_pair };
                    assert_eq!(k, want, "{n} cases: {c} after {p}");
                }
            }
        }
    }

    #[test]
    fn every_case_runs_once_every_round() {
        for (cases, rounds) in [(1, 1), (1, 5), (2, 3), (5, 2), (7, 10)] {
            let r = Rounds::new(cases, rounds, 1000);
            assert_eq!(r.turns().count() as u64, cases as u64 * rounds);
            for round in 0..rounds {
                let mut o = order_of(r, round);
                o.sort_unstable();
                assert_eq!(o, (0..cases).collect::<Vec<_>>(), "round {round}");
            }
        }
    }

    #[test]
    fn each_case_gets_exactly_the_total() {
        for (cases, rounds, total) in [(3, 4, 10), (2, 7, 7), (4, 3, 1_000_001), (1, 10, 9)] {
            let r = Rounds::new(cases, rounds, total);
            for case in 0..cases {
                let sum: u64 = r.turns().filter(|t| t.case == case).map(|t| t.amount).sum();
                assert_eq!(sum, total, "{cases} cases, {rounds} rounds, total {total}");
            }
            // Shares differ by at most one, larger first.
            let shares: Vec<u64> = r
                .turns()
                .filter(|t| t.case == 0)
                .map(|t| t.amount)
                .collect();
            assert!(shares.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
        }
    }

    #[test]
    fn no_cases_or_no_rounds_mean_no_turns() {
        assert_eq!(Rounds::new(0, 3, 10).turns().count(), 0);
        assert_eq!(Rounds::new(3, 0, 10).turns().count(), 0);
    }
}
