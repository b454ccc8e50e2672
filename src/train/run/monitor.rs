//! The stability monitor: loss spikes (above `spike_factor` x the rolling
//! mean), gradient explosions (above `explosion_factor` x the clip norm), and
//! plateaus (no relative improvement above `plateau_tolerance` for
//! `plateau_steps`). Events go to the metrics log and to stderr.

use super::record::{Event, EventKind};
use crate::config::MonitorConfig;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MonitorState {
    window: VecDeque<f64>,
    best: Option<f64>,
    best_step: usize,
    last_plateau: usize,
}

pub struct Monitor {
    cfg: MonitorConfig,
    clip: f64,
    pub state: MonitorState,
}

impl Monitor {
    pub fn new(cfg: MonitorConfig, clip: f64) -> Monitor {
        Monitor {
            cfg,
            clip,
            state: MonitorState::default(),
        }
    }

    pub fn observe(&mut self, step: usize, loss: f64, grad_norm: f64) -> Vec<Event> {
        let mut events = Vec::new();
        let s = &mut self.state;
        if s.window.len() >= self.cfg.window.max(1) {
            let mean = s.window.iter().sum::<f64>() / s.window.len() as f64;
            if loss > self.cfg.spike_factor * mean {
                events.push(Event {
                    step,
                    event: EventKind::LossSpike,
                    value: loss,
                    threshold: self.cfg.spike_factor * mean,
                    detail: None,
                });
            }
        }
        if self.clip > 0.0 && grad_norm > self.cfg.explosion_factor * self.clip {
            events.push(Event {
                step,
                event: EventKind::GradientExplosion,
                value: grad_norm,
                threshold: self.cfg.explosion_factor * self.clip,
                detail: None,
            });
        }
        s.window.push_back(loss);
        while s.window.len() > self.cfg.window.max(1) {
            s.window.pop_front();
        }
        match s.best {
            Some(b) if loss >= b * (1.0 - self.cfg.plateau_tolerance) => {
                let since = step - s.best_step.max(s.last_plateau);
                if self.cfg.plateau_steps > 0 && since >= self.cfg.plateau_steps {
                    events.push(Event {
                        step,
                        event: EventKind::Plateau,
                        value: loss,
                        threshold: b,
                        detail: None,
                    });
                    s.last_plateau = step;
                }
            }
            _ => {
                s.best = Some(loss.min(s.best.unwrap_or(f64::MAX)));
                s.best_step = step;
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MonitorConfig {
        MonitorConfig {
            window: 3,
            plateau_steps: 5,
            ..Default::default()
        }
    }

    #[test]
    fn spikes_and_explosions_are_reported() {
        let mut m = Monitor::new(cfg(), 1.0);
        for step in 1..=3 {
            assert!(m.observe(step, 4.0, 0.5).is_empty());
        }
        let e = m.observe(4, 7.0, 0.5);
        assert_eq!(e[0].event, EventKind::LossSpike);
        let e = m.observe(5, 4.0, 3.5);
        assert_eq!(e[0].event, EventKind::GradientExplosion);
    }

    #[test]
    fn a_plateau_is_reported_once_per_window() {
        let mut m = Monitor::new(cfg(), 0.0);
        let mut seen = vec![];
        for step in 1..=12 {
            seen.extend(
                m.observe(step, 3.0, 0.1)
                    .into_iter()
                    .map(|e| (e.step, e.event)),
            );
        }
        assert_eq!(
            seen,
            vec![(6, EventKind::Plateau), (11, EventKind::Plateau)]
        );
    }
}
