"""The generation runner never imports torch: an exported decoder generates, through the
API and `opforge generate`, in a process where `import torch` fails, with eager's tokens."""

from __future__ import annotations

import json

from generate_models import PROMPT, eager_tokens, program
from opforge.program import save


def test_generate_runs_without_torch(tmp_path, python_without_torch):
    path = tmp_path / "decoder.opf"
    save(program("flat"), path)
    expected = eager_tokens(tuple(PROMPT), 16)
    done = python_without_torch(f"""
        import json, sys
        from opforge.runtime.generate import generate
        result = generate({str(path)!r}, {PROMPT!r}, 16)
        from opforge.cli import main
        sys.argv = ["opforge", "generate", {str(path)!r}, "--prompt-ids", "5,9,1,3",
                    "--max-new-tokens", "16", "--json"]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        assert "torch" not in sys.modules, "torch was imported"
        print(json.dumps({{"api": list(result.tokens)}}))
    """)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["tokens"] == expected and lines[1]["api"] == expected
