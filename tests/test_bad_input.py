"""Issue 6's list of bad input, each tried through the CLI: one clear line, exit code 2, no
traceback, and the records database byte-for-byte unchanged."""
import hashlib

import pytest
from sqlalchemy import create_engine, text

from test_cli import assert_one_line_error, tuner


def digest(url: str) -> str:
    """Every row of every table, in a stable order."""
    eng = create_engine(url)
    h = hashlib.sha1()
    with eng.connect() as c:
        for (name,) in c.execute(text("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")):
            for row in c.execute(text(f"SELECT * FROM {name} ORDER BY 1")):
                h.update(repr(tuple(row)).encode())
    eng.dispose()
    return h.hexdigest()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A database with real records and a valid export of them."""
    from test_db import fill

    from tuner.db.jsonl import export_jsonl
    from tuner.db.store import Store

    d = tmp_path_factory.mktemp("bad")
    url = f"sqlite:///{d / 'db.sqlite'}"
    s = Store(url)
    fill(s)
    good = d / "good.jsonl"
    with open(good, "w") as fh:
        export_jsonl(s, fh)
    s.close()
    return url, d, good.read_text().splitlines()


def corrupt_files(d, lines):
    cases = {
        "partial_line": "\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]),
        "wrong_fields": "\n".join(lines + ['{"hello": "world"}']),
        "wrong_types": "\n".join([lines[0].replace('"threads": 1', '"threads": [1]')] + lines[1:]),
        "bad_config": "\n".join([lines[0].replace('"config": {', '"config": {"x": 1.5, ')] + lines[1:]),
        "bad_workload": "\n".join([lines[0].replace('"workload": "gemm:', '"workload": "conv9d:')] + lines[1:]),
        "binary": "\x00\x01\x02garbage",
    }
    out = {}
    for name, content in cases.items():
        p = d / f"{name}.jsonl"
        p.write_text(content)
        out[name] = str(p)
    return out


BAD_COMMANDS = [
    ["tune", "gemm", "--shape", "1024x"],
    ["tune", "gemm", "--shape", "0x5x5"],
    ["tune", "gemm", "--shape", "axbxc"],
    ["tune", "gemm", "--shape", "-3x4x5"],
    ["tune", "gemm", "--shape", "100000x100000x100000"],
    ["tune", "conv9d", "--shape", "8x8x8"],
    ["tune", "gemm", "--shape", "8x8x8", "--strategy", "annealing"],
    ["show", "gemm", "--shape", "8x8x8", "--config", "{\"tile_m\": "],
    ["show", "gemm", "--shape", "8x8x8", "--config", "[1, 2]"],
    ["show", "gemm", "--shape", "8x8x8", "--config", "{\"no_such_knob\": 1}"],
    ["run", "gemm", "--shape", "8x8x8", "--strict"],
    ["db", "history", "--workload", "8xx8"],
    ["db", "history", "--limit", "-1"],                      # was rows[1:]: all but the first
    ["bench", "ladder", "--shape", "8x8x8", "--tune-trials", "-1"],
    ["bench", "int8", "--shapes", "8x8x8", "--tune-trials", "-2"],
]


@pytest.mark.parametrize("args", BAD_COMMANDS, ids=lambda a: " ".join(a[:4]))
def test_bad_command(seeded, args):
    url, _, _ = seeded
    before = digest(url)
    assert_one_line_error(tuner(*args, "--db", url))
    assert digest(url) == before


@pytest.mark.parametrize("case", ["partial_line", "wrong_fields", "wrong_types", "bad_config",
                                  "bad_workload", "binary"])
def test_corrupt_import(seeded, case):
    url, d, lines = seeded
    path = corrupt_files(d, lines)[case]
    before = digest(url)
    p = tuner("db", "import", path, "--db", url)
    assert_one_line_error(p)
    assert "nothing was imported" in p.stderr or "not UTF-8" in p.stderr or "JSON" in p.stderr
    assert digest(url) == before


def test_database_from_a_newer_schema(seeded, tmp_path):
    url, _, _ = seeded
    import shutil

    path = url.removeprefix("sqlite:///")
    newer = tmp_path / "newer.db"
    shutil.copy(path, newer)
    eng = create_engine(f"sqlite:///{newer}")
    with eng.begin() as c:
        c.execute(text("UPDATE meta SET value='2' WHERE key='schema_version'"))
    eng.dispose()
    before = newer.read_bytes()
    for args in (["db", "list"], ["tune", "gemm", "--shape", "8x8x8", "--trials", "1"]):
        p = tuner(*args, "--db", f"sqlite:///{newer}")
        assert_one_line_error(p)
        assert "newer" in p.stderr
    assert newer.read_bytes() == before


def test_not_a_database(tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("this is not sqlite\n" * 100)
    p = tuner("db", "list", "--db", f"sqlite:///{bogus}")
    assert_one_line_error(p)
    assert bogus.read_text() == "this is not sqlite\n" * 100


def test_valid_import_still_works_after_all_that(seeded, tmp_path):
    _, _, lines = seeded
    good = tmp_path / "ok.jsonl"
    good.write_text("\n".join(lines) + "\n")
    p = tuner("db", "import", str(good), "--db", f"sqlite:///{tmp_path / 'new.db'}")
    assert p.returncode == 0 and "imported 7 trials" in p.stdout


MODEL_COMMANDS = [["build"], ["run-model"], ["verify"], ["tasks"], ["tune", "model"]]


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    onnx = pytest.importorskip("onnx", reason="onnx extra not installed (pip install -e '.[onnx]')")
    import os

    d = tmp_path_factory.mktemp("models")
    light = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_squeezenet.onnx")
    data = open(light, "rb").read()
    (d / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (d / "text.onnx").write_text("graph g() {}\nthis is not onnx\n")
    (d / "empty.onnx").write_bytes(b"")
    return {"truncated": d / "truncated.onnx", "not onnx": d / "text.onnx",
            "empty": d / "empty.onnx", "missing": d / "missing.onnx"}


@pytest.mark.parametrize("cmd", MODEL_COMMANDS, ids=lambda c: " ".join(c))
@pytest.mark.parametrize("case", ["truncated", "not onnx", "empty", "missing"])
def test_bad_model_file(seeded, bad_models, cmd, case):
    url, _, _ = seeded
    before = digest(url)
    assert_one_line_error(tuner(*cmd, str(bad_models[case]), "--db", url))
    assert digest(url) == before
