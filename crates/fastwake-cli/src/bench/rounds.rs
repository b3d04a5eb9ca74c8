//! The one round-interleaving schedule of `bench pingpong|ipc|share|load`.
//!
//! These machines are noisy: a slow second ruins whichever case runs in
//! it. So a run is cut into rounds and every round gives each case one
//! turn; a noisy second is spread over all cases instead of ruining one,
//! and ratios between rows hold even when absolute figures drift. The
//! start of each round moves on by one case, so no case always runs first
//! (right after a setup, or a pause while the previous round was printed)
//! or always right after the same neighbour.

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

    /// Every turn, round by round; round `r` starts with case `r % cases`.
    pub fn turns(self) -> impl Iterator<Item = Turn> {
        (0..self.rounds).flat_map(move |round| {
            let amount = self.amount(round);
            let start = (round % self.cases.max(1) as u64) as usize;
            (0..self.cases).map(move |k| Turn {
                round,
                case: (start + k) % self.cases,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn order(r: Rounds, round: u64) -> Vec<usize> {
        r.turns()
            .filter(|t| t.round == round)
            .map(|t| t.case)
            .collect()
    }

    #[test]
    fn the_start_rotates_every_round() {
        let r = Rounds::new(3, 4, 100);
        assert_eq!(order(r, 0), [0, 1, 2]);
        assert_eq!(order(r, 1), [1, 2, 0]);
        assert_eq!(order(r, 2), [2, 0, 1]);
        assert_eq!(order(r, 3), [0, 1, 2]);
    }

    #[test]
    fn every_case_runs_once_every_round() {
        for (cases, rounds) in [(1, 1), (1, 5), (2, 3), (5, 2), (7, 10)] {
            let r = Rounds::new(cases, rounds, 1000);
            assert_eq!(r.turns().count() as u64, cases as u64 * rounds);
            for round in 0..rounds {
                let mut o = order(r, round);
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
