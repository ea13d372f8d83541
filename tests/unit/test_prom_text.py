"""parse_samples: a tolerant Prometheus text reader for engine load probes."""

from __future__ import annotations

import math

from llm_gateway.adapters.prom_text import parse_samples, peak, total


def summed(text: bytes) -> dict[str, float]:
    return {k: sum(v) for k, v in parse_samples(text).items()}


LLAMACPP = b"""\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 218
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.768032
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""

VLLM_TWO_ENGINES = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 12.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0
vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 7.0
"""


def test_llama_cpp_integer_output_without_labels():
    assert summed(LLAMACPP) == {
        "llamacpp:prompt_tokens_total": 218.0,
        "llamacpp:prompt_seconds_total": 0.768032,
        "llamacpp:requests_processing": 2.0,
        "llamacpp:requests_deferred": 1.0,
    }


def test_labelled_samples_are_summed_across_label_sets():
    assert summed(VLLM_TWO_ENGINES) == {
        "vllm:num_requests_running": 15.0,
        "vllm:num_requests_waiting": 2.0,
        "vllm:num_requests_waiting_by_reason": 7.0,
    }


def test_a_metric_whose_name_extends_another_is_not_mixed_in():
    got = summed(VLLM_TWO_ENGINES)
    assert got["vllm:num_requests_waiting"] == 2.0  # not 9.0 with the _by_reason series


def test_comments_and_blank_lines_are_ignored():
    assert summed(b"# HELP x y\n\n   \n# TYPE x gauge\nx 1\n# x 99\n") == {"x": 1.0}


def test_a_trailing_timestamp_is_not_the_value():
    assert summed(b"sglang:num_running_reqs 7 1796008616000\n") == {"sglang:num_running_reqs": 7.0}


def test_label_values_may_contain_spaces_commas_and_braces():
    text = b'm{path="/a b",note="x}y, z"} 4\nm{path="/c"} 1\n'
    assert summed(text) == {"m": 5.0}


def test_empty_label_set_is_accepted():
    assert summed(b"m{} 3\n") == {"m": 3.0}


def test_garbage_lines_are_skipped_without_failing_the_rest():
    text = b"""\
ok_before 1
just_a_name
name not_a_number
{only="labels"} 5
broken{label="x" 7
}reversed{ 3
ok_after 2
"""
    assert summed(text) == {"ok_before": 1.0, "ok_after": 2.0}


def test_nan_samples_are_skipped_and_do_not_poison_the_sum():
    text = b'g{engine="0"} NaN\ng{engine="1"} 0.25\nh NaN\n'
    assert summed(text) == {"g": 0.25}


def test_infinities_and_exponents_parse():
    got = summed(b"a +Inf\nb -Inf\nc 1.5e3\nd -2E-2\n")
    assert math.isinf(got["a"]) and got["a"] > 0
    assert math.isinf(got["b"]) and got["b"] < 0
    assert (got["c"], got["d"]) == (1500.0, -0.02)


def test_crlf_line_endings_and_leading_whitespace_are_tolerated():
    assert summed(b'  a 1\r\nb{x="1"} 2\r\n') == {"a": 1.0, "b": 2.0}


def test_invalid_utf8_does_not_raise():
    assert summed(b'm{model_name="caf\xe9"} 2\n') == {"m": 2.0}


def test_empty_input_gives_no_samples():
    assert summed(b"") == {}


def test_counts_add_up_across_ranks_but_fractions_take_the_fullest_rank():
    text = b'kv{engine="0"} 0.5\nkv{engine="1"} 0.25\nrun{engine="0"} 3\nrun{engine="1"} 4\n'
    samples = parse_samples(text)
    assert total(samples, "run") == 7.0
    assert peak(samples, "kv") == 0.5
    assert total(samples, "missing") is None and peak(samples, "missing") is None
