//! Stop strings over streamed deltas, alone and fed by the incremental decoder.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use common::smollm2_both;
use tessera_tokenizer::{IncrementalDecoder, StopMatcher, StopOutcome};

fn feed(matcher: &mut StopMatcher, deltas: &[&str]) -> (String, Option<usize>) {
    let mut out = String::new();
    for delta in deltas {
        let StopOutcome { text, stopped_by } = matcher.push(delta);
        out.push_str(&text);
        if stopped_by.is_some() {
            return (out, stopped_by);
        }
    }
    out.push_str(&matcher.finish());
    (out, None)
}

#[test]
fn stop_spanning_deltas_is_found_and_cut() {
    let mut m = StopMatcher::new(["END"]);
    assert_eq!(m.push("Hello E").text, "Hello ");
    assert_eq!(m.push("N").text, "");
    let out = m.push("D and more");
    assert_eq!(
        out,
        StopOutcome {
            text: String::new(),
            stopped_by: Some(0)
        }
    );
    assert!(m.is_stopped());
    assert_eq!(m.push("ignored").text, "");
    assert_eq!(m.finish(), "");
}

#[test]
fn held_back_prefix_is_released_when_it_does_not_match() {
    let mut m = StopMatcher::new(["END"]);
    assert_eq!(m.push("Hello EN").text, "Hello ");
    assert_eq!(m.push("Z").text, "ENZ");
    assert_eq!(m.push("EN").text, "");
    assert_eq!(m.finish(), "EN");
}

#[test]
fn multiple_stops_earliest_wins() {
    let mut m = StopMatcher::new(["world", "lo w", "\n\n"]);
    assert_eq!(
        feed(&mut m, &["Hel", "lo wor", "ld"]),
        ("Hel".to_string(), Some(1))
    );
    let mut m = StopMatcher::new(["###", "\n\n"]);
    assert_eq!(
        feed(&mut m, &["a\n", "\nb ###"]),
        ("a".to_string(), Some(1))
    );
    let mut m = StopMatcher::new(["abc", "xyz"]);
    assert_eq!(
        feed(&mut m, &["ab", "xy", "z!"]),
        ("ab".to_string(), Some(1))
    );
}

#[test]
fn stop_at_the_very_start() {
    let mut m = StopMatcher::new(["<stop>"]);
    assert_eq!(feed(&mut m, &["<st", "op>tail"]), (String::new(), Some(0)));
    let mut m = StopMatcher::new(["x"]);
    assert_eq!(feed(&mut m, &["x"]), (String::new(), Some(0)));
}

#[test]
fn no_stops_and_empty_stops_pass_everything() {
    let mut m = StopMatcher::new(Vec::<String>::new());
    assert_eq!(feed(&mut m, &["a", "b"]), ("ab".to_string(), None));
    let mut m = StopMatcher::new([""]);
    assert_eq!(feed(&mut m, &["a", "b"]), ("ab".to_string(), None));
}

#[test]
fn multibyte_text_is_held_on_character_boundaries() {
    let mut m = StopMatcher::new(["日本語です"]);
    assert_eq!(m.push("これは日本").text, "これは");
    assert_eq!(m.push("語").text, "");
    assert_eq!(m.push("だ").text, "日本語だ");
    assert_eq!(
        feed(&mut m, &["日本語で", "す。"]),
        (String::new(), Some(0))
    );
}

#[test]
fn stop_spanning_tokens_through_the_decoder() {
    for (path, tokenizer) in smollm2_both() {
        let text = "The capital of France is Paris. The end.";
        let ids = tokenizer.encode(text, false).unwrap();
        // "Paris." spans at least two tokens (" Paris" and ".").
        let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
        let mut matcher = StopMatcher::new(["is Paris."]);
        let mut shown = String::new();
        let mut stopped = None;
        let mut tokens_used = 0;
        for id in ids.iter().copied() {
            tokens_used += 1;
            let outcome = matcher.push(&decoder.push(id).unwrap());
            shown.push_str(&outcome.text);
            if outcome.stopped_by.is_some() {
                stopped = outcome.stopped_by;
                break;
            }
        }
        assert_eq!(stopped, Some(0), "[{path}]");
        assert_eq!(shown, "The capital of France ", "[{path}]");
        assert!(
            tokens_used < ids.len(),
            "[{path}] stopped at the token that completed it"
        );
    }
}

#[test]
fn an_included_stop_string_ends_the_text() {
    let mut m = StopMatcher::new(["END", "."]).including_stop(true);
    assert_eq!(
        feed(&mut m, &["one E", "ND two."]),
        ("one END".into(), Some(0))
    );
    let mut m = StopMatcher::new(["\n\n"]).including_stop(true);
    assert_eq!(feed(&mut m, &["a\n", "\nb"]), ("a\n\n".into(), Some(0)));
}

#[test]
fn unchecked_text_passes_stops_but_keeps_a_prefix_that_may_complete_one() {
    let mut m = StopMatcher::new(["STOP"]);
    // A whole stop string before the minimum is text like any other.
    assert_eq!(m.push_unchecked("a STOP b ST"), "a STOP b ");
    // One begun before the minimum and ended after it still stops the text.
    assert_eq!(
        m.push("OP c"),
        StopOutcome {
            text: String::new(),
            stopped_by: Some(0)
        }
    );
    let mut m = StopMatcher::new(["STOP"]);
    assert_eq!(m.push_unchecked("x ST"), "x ");
    assert_eq!(m.push("ay").text, "STay");
    assert_eq!(m.finish(), "");
}
