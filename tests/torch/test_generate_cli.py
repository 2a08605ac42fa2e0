"""`opforge generate`: token ids in and out, rates printed, stops explained, bad input
refused with a reason; text in and out through a tokenizer.json when the optional
`tokenizers` library is installed (skipped otherwise)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from generate_models import PROMPT, eager_tokens, program
from opforge.cli import cli
from opforge.program import save
from opforge.runtime.tokenizer import tokenizers_available


def _cli(*args):
    result = CliRunner().invoke(cli, [*map(str, args)])
    return result.exit_code, result.output + str(result.exception or "")


@pytest.fixture(scope="module")
def decoder_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("generate") / "decoder.opf"
    save(program("flat"), path)
    return path


def test_greedy_tokens_and_rates(decoder_file):
    code, text = _cli("generate", decoder_file, "--prompt-ids", "5,9,1,3",
                      "--max-new-tokens", 32)
    assert code == 0, text
    expected = " ".join(map(str, eager_tokens(tuple(PROMPT), 32)))
    assert f"generated (32 tokens): {expected}" in text
    assert "flat layout, vocabulary 64, cache 48 positions" in text
    assert "prefill: 4 tokens in" in text and "decode: 31 tokens in" in text
    assert "tokens/s" in text


def test_json_output_and_seeded_sampling(decoder_file):
    args = ("generate", decoder_file, "--prompt-ids", "5 9 1 3", "--max-new-tokens", 10,
            "--temperature", 0.7, "--top-k", 5, "--seed", 11, "--json")
    (code, first), (_, second) = _cli(*args), _cli(*args)
    assert code == 0, first
    assert json.loads(first)["tokens"] == json.loads(second)["tokens"]
    data = json.loads(first)
    assert data["stop_reason"] == "length" and data["cache_bytes"] == 12288


def test_capacity_and_end_token_messages(decoder_file):
    code, text = _cli("generate", decoder_file, "--prompt-ids", "5,9,1,3",
                      "--max-new-tokens", 100)
    assert code == 0, text
    assert "stopped at the cache's capacity: 48 positions" in text
    assert "45 new token(s), fewer than the 100 asked for" in text
    eos = eager_tokens(tuple(PROMPT), 32)[3]
    code, text = _cli("generate", decoder_file, "--prompt-ids", "5,9,1,3", "--eos-id", eos)
    assert code == 0 and f"stopped at end token {eos}" in text, text



def test_a_prompt_that_fills_the_cache_says_so_instead_of_decoding_zero_tokens(decoder_file):
    code, text = _cli("generate", decoder_file, "--prompt-ids", ",".join(map(str, range(48))))
    assert code == 0, text
    assert "decode: none — the cache is full: the prompt filled its 48 positions, so no " \
           "token was decoded" in text, text
    # a zero decode rate, not a prefill rate that ends in it ("16040.0 tokens/s")
    assert re.search(r"(?<![\d.])0\.0 tokens/s", text) is None, text
    code, text = _cli("generate", decoder_file, "--prompt-ids", "1,2", "--max-new-tokens", 1)
    assert code == 0 and "decode: none — the prefill's token was the last one" in text, text

@pytest.mark.parametrize("args, message", [
    (("--prompt-ids", "5,64"), "found [64] — valid: token ids, integers in [0, 64)"),
    (("--prompt-ids", "5,x"), "token ids separated by commas or spaces"),
    (("--prompt-ids", ","), "prompt — found no tokens"),
    ((), "exactly one of them"),
    (("--prompt", "hello"), "--prompt TEXT needs --tokenizer"),
    (("--prompt-ids", "1", "--method", "nope"), "method 'nope' — not in the program"),
    (("--prompt-ids", "1", "--temperature", "0.7", "--seed", "-1"),
     "Sampler(seed=...)`: found -1 — valid: an integer >= 0"),
])
def test_bad_input_is_refused(decoder_file, args, message):
    code, text = _cli("generate", decoder_file, *args)
    assert code != 0 and message in text, text


def test_a_program_without_state_is_refused(tmp_path):
    path = tmp_path / "stateless.opf"
    save(program("stateless"), path)
    code, text = _cli("generate", path, "--prompt-ids", "1,2")
    assert code != 0 and "has no state" in text, text


def _word_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(62)}
    vocab.update({"[UNK]": 62, "</s>": 63})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.mark.skipif(not tokenizers_available(),
                    reason="the optional `tokenizers` library is not installed "
                           "(pip install 'opforge[text]')")
def test_text_in_and_out_with_a_tokenizer(decoder_file, tmp_path):
    path = _word_tokenizer(tmp_path)
    expected = eager_tokens(tuple(PROMPT), 12)
    code, text = _cli("generate", decoder_file, "--tokenizer", path, "--prompt", "w5 w9 w1 w3",
                      "--max-new-tokens", 12, "--json")
    assert code == 0, text
    data = json.loads(text)
    assert data["prompt_ids"] == PROMPT and data["tokens"] == expected
    assert data["text"] == " ".join(f"w{t}" for t in expected if t != 63)
    # the same through the Python API: text in, text out
    from opforge.runtime.generate import Generator

    result = Generator(program("flat"), tokenizer=path).generate("w5 w9 w1 w3", 12)
    assert list(result.tokens) == expected and result.text == data["text"]
    # the end token from tokenizer_config.json: the first generated token ends it
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w50"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [52]}))
    code, text = _cli("generate", decoder_file, "--tokenizer", path, "--prompt", "w5 w9 w1 w3",
                      "--json")
    data = json.loads(text)
    assert data["stop_reason"] == "eos" and data["tokens"] == expected[:1] == [50], text


@pytest.mark.skipif(tokenizers_available(), reason="tokenizers is installed here")
def test_without_tokenizers_text_is_refused_with_the_fix(decoder_file, tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    code, text = _cli("generate", decoder_file, "--tokenizer", tmp_path / "tokenizer.json",
                      "--prompt", "hello")
    assert code != 0 and "pip install 'opforge[text]'" in text, text


def test_the_documented_decoder_export_commands_run(tmp_path, monkeypatch):
    """docs/generation.md, "Exporting a decoder from the command line": every `opforge`
    command there runs as written (the factory file written from the page), and each
    generate continues the eager model's greedy tokens."""
    import re
    import shlex
    from pathlib import Path

    from opforge.backends.cpu.engine import missing
    from opforge.examples.decoder import TinyDecoder, greedy_decode

    page = (Path(__file__).parents[2] / "docs" / "generation.md").read_text()
    section = page.split("## Exporting a decoder from the command line", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    for language, body in blocks:
        if language == "python" and body.startswith("# my_decoder.py"):
            (tmp_path / "my_decoder.py").write_text(body)
    commands = [line for language, body in blocks if language == "bash"
                for line in body.splitlines() if line.startswith("opforge ")]
    assert len(commands) == 6 and (tmp_path / "my_decoder.py").is_file()
    monkeypatch.chdir(tmp_path)
    model = TinyDecoder().eval()
    expected = " ".join(map(str, greedy_decode(lambda t, p: model(t, p), [5, 9, 1, 3], 8)))
    for command in commands:
        if "--backend cpu" in command and missing() is not None:
            continue
        code, text = _cli(*shlex.split(command)[1:])
        assert code == 0, (command, text)
        if command.startswith("opforge generate"):
            assert f"generated (8 tokens): {expected}" in text, (command, text)
