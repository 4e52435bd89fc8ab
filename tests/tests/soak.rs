//! Issue 50: the node manager's soak, short. Tenants churn (some
//! SIGKILLed), the daemon is SIGKILLed and restarted, budgets change and
//! hostile clients attack (as another user where the test runs as root),
//! for 30 s; every invariant must hold throughout (see `dilu_tests::soak`).
//! The long run is `scripts/bench.sh soak`.

use dilu_tests::soak::{self, SoakConfig};
use std::time::Duration;

#[test]
fn a_short_soak_holds_every_invariant() {
    let config = SoakConfig {
        duration: Duration::from_secs(30),
        tenants: 4,
        seed: 50,
        // Above the bench's 15 s: a restarted daemon keeps a flood's
        // tenants for their 10 s re-adoption grace, and this runs on a
        // loaded CI machine.
        unmanaged_limit: Duration::from_secs(20),
        ..SoakConfig::default()
    };
    let report = soak::run(config.clone(), |line| eprintln!("{line}"));
    let text = soak::markdown(&config, &report, "cargo test -p dilu-tests --test soak");
    println!("{text}");
    let events = |name: &str| report.events.get(name).copied().unwrap_or(0);
    assert!(events("tenant started") >= 4, "tenants ran: {text}");
    assert!(
        events("status checked") >= 10,
        "invariants were checked: {text}"
    );
    // As root the hostile clients are another user: each visit ran as that
    // uid and said what it came to.
    if report.hostile_uid.is_some() {
        let visits: u64 = soak::HOSTILE_EVENTS.iter().map(|e| events(e)).sum();
        assert!(visits > 0, "hostile clients ran as another user: {text}");
        assert_eq!(
            events("hostile: could not start as another user")
                + events("hostile: the other user's client said nothing"),
            0,
            "{text}"
        );
    }
    assert!(
        report.violations.is_empty(),
        "broken invariants: {:#?}",
        report.violations
    );
}
