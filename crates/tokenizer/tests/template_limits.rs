//! Hostile or broken chat templates fail quickly with an error that names the problem.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

use std::time::{Duration, Instant};

use tessera_tokenizer::{
    ChatMessage, ChatRenderRequest, ChatTemplate, ChatTemplateConfig, SpecialTokenStrings,
    TokenizerError,
};

fn render(source: &str) -> (Result<String, TokenizerError>, Duration) {
    let template = ChatTemplate::new(
        source,
        SpecialTokenStrings::default(),
        &ChatTemplateConfig::default(),
    )
    .unwrap();
    let request = ChatRenderRequest {
        messages: vec![ChatMessage::new("user", "hi")],
        ..Default::default()
    };
    let start = Instant::now();
    let result = template.render(&request);
    (result, start.elapsed())
}

#[test]
fn huge_loop_errors_quickly() {
    let (result, elapsed) = render("{% for i in range(100000000) %}{{ i }}{% endfor %}");
    let err = result.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("range"), "{err}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn nested_loops_run_out_of_fuel() {
    let (result, elapsed) = render(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i * j }}{% endfor %}{% endfor %}",
    );
    let err = result.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("budget"), "{err}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[test]
fn endless_output_is_capped() {
    let (result, elapsed) = render("{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}");
    let err = result.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("exceeds"), "{err}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[test]
fn deep_recursion_errors() {
    let (result, elapsed) = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    let err = result.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("recursion"), "{err}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn raise_exception_reaches_the_caller() {
    let (result, _) = render(
        "{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}",
    );
    let err = result.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("System message required"), "{err}");
}

#[test]
fn syntax_errors_are_reported_at_compile_time() {
    let err = ChatTemplate::new(
        "{% for m in messages %}{{ m.content }}",
        SpecialTokenStrings::default(),
        &ChatTemplateConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("chat template"), "{err}");
    assert!(
        err.contains("endfor") || err.contains("end of input"),
        "{err}"
    );
}

#[test]
fn booleans_and_none_print_as_in_python() {
    let (result, _) = render("{{ true }} {{ 1 > 2 }} {{ none }} {{ messages[0].missing }}|");
    assert_eq!(result.unwrap(), "True False None |");
    // As in transformers, `tools` and `documents` are None, not undefined, when absent.
    let (result, _) = render("{{ tools is none }} {{ documents is not none }}");
    assert_eq!(result.unwrap(), "True False");
}

#[test]
fn python_string_methods_work() {
    let (result, _) = render(
        "{{ messages[0].content.upper() }}|{{ '  x  '.strip() }}|{{ 'a,b'.split(',') | join('+') }}|{% if 'abc'.startswith('a') %}yes{% endif %}",
    );
    assert_eq!(result.unwrap(), "HI|x|a+b|yes");
}
