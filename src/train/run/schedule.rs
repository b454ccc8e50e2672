//! When a step logs, validates and checkpoints: built once from the
//! configuration, so the run loop only asks.

use crate::config::TrainConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    steps: usize,
    log_every: usize,
    /// 0: never.
    validate_every: usize,
    /// 0: only at the end (and on a signal, which the loop handles).
    checkpoint_every: usize,
    checkpoint_at_end: bool,
}

/// What is due after one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Due {
    /// Write a metrics line (every validation comes with one, to carry `val_loss`).
    pub log: bool,
    pub validate: bool,
    pub checkpoint: bool,
}

impl Schedule {
    pub fn new(cfg: &TrainConfig) -> Schedule {
        Schedule {
            steps: cfg.training_steps,
            log_every: cfg.logging_frequency.max(1),
            validate_every: cfg.validation_every,
            checkpoint_every: cfg.checkpoint_every,
            checkpoint_at_end: cfg.checkpoint_at_end,
        }
    }

    pub fn at(&self, step: usize) -> Due {
        let last = step == self.steps;
        let every = |n: usize| n > 0 && step.is_multiple_of(n);
        let validate = self.validate_every > 0 && (every(self.validate_every) || last);
        Due {
            log: step == 1 || every(self.log_every) || last || validate,
            validate,
            checkpoint: every(self.checkpoint_every) || (last && self.checkpoint_at_end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_where(s: &Schedule, f: impl Fn(Due) -> bool) -> Vec<usize> {
        (1..=s.steps).filter(|&i| f(s.at(i))).collect()
    }

    #[test]
    fn validation_runs_on_its_own_steps_not_only_on_logging_steps() {
        let s = Schedule {
            steps: 100,
            log_every: 10,
            validate_every: 25,
            checkpoint_every: 0,
            checkpoint_at_end: true,
        };
        assert_eq!(steps_where(&s, |d| d.validate), vec![25, 50, 75, 100]);
        let logged = steps_where(&s, |d| d.log);
        assert!(logged.contains(&25) && logged.contains(&75) && logged.contains(&1));
        assert_eq!(
            logged.len(),
            1 + 10 + 2,
            "every 10th, the first, and 25, 75"
        );
        assert_eq!(steps_where(&s, |d| d.checkpoint), vec![100]);
    }

    #[test]
    fn the_last_step_logs_validates_and_checkpoints() {
        let s = Schedule {
            steps: 33,
            log_every: 10,
            validate_every: 20,
            checkpoint_every: 15,
            checkpoint_at_end: true,
        };
        assert_eq!(
            s.at(33),
            Due {
                log: true,
                validate: true,
                checkpoint: true
            }
        );
        assert_eq!(steps_where(&s, |d| d.checkpoint), vec![15, 30, 33]);
        let off = Schedule {
            validate_every: 0,
            ..s
        };
        assert!(steps_where(&off, |d| d.validate).is_empty());
        let no_final = Schedule {
            checkpoint_at_end: false,
            ..s
        };
        assert_eq!(steps_where(&no_final, |d| d.checkpoint), vec![15, 30]);
    }

    #[test]
    fn the_configuration_counts_the_steps_the_schedule_logs() {
        for (steps, log, val) in [
            (8, 2, 0),
            (1, 5, 0),
            (100, 10, 25),
            (33, 5, 4),
            (7, 1, 3),
            (10, 3, 6),
            (12, 4, 6),
            (0, 1, 0),
        ] {
            let cfg = TrainConfig {
                training_steps: steps,
                logging_frequency: log,
                validation_every: val,
                validation_batches: 1,
                ..TrainConfig::default()
            };
            let s = Schedule::new(&cfg);
            let logged = steps_where(&s, |d| d.log).len();
            assert_eq!(
                cfg.logged_steps(),
                logged,
                "{steps} steps, every {log}, validation {val}"
            );
        }
    }
}
