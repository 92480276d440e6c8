import json

from bench.report import emit


def test_emit_prints_and_writes_the_same_json(tmp_path, capsys):
    report = {"rows": [{"p50": 1.5}], "path": tmp_path}  # a Path is written as its str
    out = tmp_path / "results" / "r.json"
    lines: list[str] = []
    text = emit(report, out, log=lines.append)
    assert capsys.readouterr().out == text + "\n"
    assert out.read_text() == text + "\n"
    assert json.loads(text) == {"rows": [{"p50": 1.5}], "path": str(tmp_path)}
    assert lines == [f"wrote {out}"]


def test_emit_without_out_or_echo(capsys):
    assert emit({"a": 1}, None, indent=1, echo=False) == '{\n "a": 1\n}'
    assert capsys.readouterr().out == ""
