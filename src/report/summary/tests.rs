use super::*;
use crate::executor::Status;

#[test]
fn a_problem_says_the_states_reason_once_and_an_ended_run_is_not_yet_to_write() {
    let pending = Status {
        reason: Some("Priority".into()),
        ..Status::new(State::Pending)
    };
    let waiting = RunLog {
        reason: pending.reason.clone(),
        ..RunLog::new("w", pending)
    };
    let ended = RunLog::new("e", Status::exited(3));
    let said: Vec<String> = problems(&[waiting, ended])
        .iter()
        .map(Problem::describe)
        .collect();
    assert_eq!(
        said,
        [
            "w: PENDING (Priority), no metrics yet",
            "e: FAILED (exit 3), no metrics"
        ]
    );
}

/// A state that carries a long reason of its own (why a record does not
/// read) is said whole, as a note, not cut like a table cell.
#[test]
fn a_states_long_reason_is_said_whole() {
    let why =
        "/tmp/results/s/run/run.json is not a valid run record: expected value at line 1 column 1";
    let unknown = Status {
        reason: Some(why.into()),
        ..Status::new(State::Unknown)
    };
    let said = problems(&[RunLog::new("r", unknown)])[0].describe();
    assert_eq!(said, format!("r: UNKNOWN ({why}), no metrics"));
}

/// Repeats more than 30% apart are said with the likeliest cause their
/// environments recorded: a busy host, else different hosts, else none.
#[test]
fn repeats_far_apart_are_said_with_their_likely_cause() {
    use crate::executor::fingerprint::Load;
    let run = |name: &str, host: &str, busy: f64| RunLog {
        host: Some(host.into()),
        load: vec![Load {
            load_average: [busy, 0.0, 0.0],
            busy_cores: busy,
            cores: 2,
        }],
        ..RunLog::new(name, Status::new(State::Completed))
    };
    let tps = [Some(1386.0), Some(2850.0), Some(1417.0)];
    let said = |runs: &[RunLog]| repeats_differ("c", &[0, 1, 2], &tps, runs);
    let busy = said(&[
        run("r0", "h", 1.9),
        run("r1", "h", 0.0),
        run("r2", "h", 0.1),
    ])
    .unwrap();
    assert!(
        busy.starts_with("the repeats of c differ by 2.06× (r0 at 1386, r1 at 2850 tokens/s): other processes kept 1.9 of 2 cores busy beside r0"),
        "{busy}"
    );
    let apart = said(&[
        run("r0", "a", 0.0),
        run("r1", "b", 0.0),
        run("r2", "a", 0.0),
    ])
    .unwrap();
    assert!(
        apart.ends_with("they ran on different hosts (a, b)"),
        "{apart}"
    );
    let quiet = said(&[
        run("r0", "h", 0.0),
        run("r1", "h", 0.0),
        run("r2", "h", 0.0),
    ])
    .unwrap();
    assert!(quiet.contains("record no other load"), "{quiet}");
    // Busy beside every repeat: said so, not pinned on the fastest one.
    let throughout = said(&[
        run("r0", "h", 2.0),
        run("r1", "h", 2.0),
        run("r2", "h", 1.9),
    ])
    .unwrap();
    assert!(
        throughout.ends_with("the machine was busy throughout: other processes kept 1.9–2.0 of 2 cores busy beside every repeat"),
        "{throughout}"
    );
    // Only the fast one busy: no cause pinned on it.
    let fast_busy = said(&[
        run("r0", "h", 0.0),
        run("r1", "h", 1.9),
        run("r2", "h", 0.0),
    ])
    .unwrap();
    assert!(
        fast_busy.contains("the slower ran no busier"),
        "{fast_busy}"
    );
    // A load average far above the cores, whatever a quarter second saw.
    let mut loaded = run("r0", "h", 0.0);
    loaded.load[0].load_average[0] = 161.0;
    let shared = said(&[loaded, run("r1", "h", 0.0), run("r2", "h", 0.0)]).unwrap();
    assert!(
        shared.contains("overloaded beside r0 (a load average 159.0 above its 2 cores)"),
        "{shared}"
    );
    let close = [Some(1386.0), Some(1500.0), Some(1417.0)];
    assert_eq!(
        repeats_differ(
            "c",
            &[0, 1, 2],
            &close,
            &[run("a", "h", 2.0), run("b", "h", 0.0), run("c", "h", 0.0)]
        ),
        None
    );
}

/// A log too short for the warm-up skip says what its figures use: the one
/// point it has, or every point after the first.
#[test]
fn a_short_log_says_which_of_its_points_the_figures_use() {
    let run = |n: usize| RunLog {
        points: (0..n)
            .map(|i| crate::report::ingest::Point {
                step: i as f64,
                tokens_per_second: Some(100.0),
                ..Default::default()
            })
            .collect(),
        ..RunLog::new(format!("r{n}"), Status::new(State::Completed))
    };
    let said: Vec<String> = short_runs(&[run(1), run(3), run(6)], 5)
        .iter()
        .map(|p| p.reason.clone())
        .collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].starts_with("it logged 1 point, not more than the 5")
            && said[0].contains("use that point"),
        "{}",
        said[0]
    );
    assert!(
        said[1].starts_with("it logged 3 points,")
            && said[1].contains("use every point after the first"),
        "{}",
        said[1]
    );
}
