//! Logs -> report: tables and charts of every run of a sweep.

pub mod plot;
