"""Teaching labs: reference answers pass, blanked student copies fail with their hint."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from kvlab import cost, labs
from kvlab.cli import guarded
from kvlab.deployment import Deployment

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def test_every_exercise_checks_its_own_answer():
    for key, ex in labs.exercises().items():
        assert labs.check(key, ex.expected()).passed
        if ex.is_choice:
            wrong = next(o for o in ex.options if o != ex.expected())
            assert not labs.check(key, wrong).passed
            continue
        assert labs.check(key, ex.expected() * 1.01).passed  # within tolerance


def _numbers_exercises():
    return {k: ex for k, ex in labs.exercises().items() if not ex.is_choice}


def test_estimates_pass_with_their_own_arithmetic_and_show_it_when_wrong():
    """The arithmetic a wrong estimate is shown lands within the estimate's tolerance of
    kvlab's exact answer; it is not the exact answer's tight check."""
    estimates = {k: ex for k, ex in labs.exercises().items() if ex.is_estimate}
    assert len(estimates) >= 8  # one reasoning lab per chapter
    for key, ex in estimates.items():
        rough, english, chinese = ex.rough()
        assert labs.check(key, rough).passed, (key, rough, ex.expected())
        assert ex.rel_tol == labs.ESTIMATE_TOL > 0.2
        assert f"{rough:.3g}".rstrip("0").rstrip(".")[:3] in english.replace(",", "")
        wrong = labs.check(key, 3 * ex.expected())
        assert not wrong.passed and "The arithmetic: " + english in wrong.message
        right = labs.check(key, ex.expected())
        assert "a good estimate" in right.message and "kvlab's exact figure" in right.message
        assert chinese and chinese != english


def test_every_estimate_comes_with_a_kvlab_call_and_a_why_in_its_chapter():
    """The three steps: estimate, the kvlab figure it estimates, and a why question."""
    exercises = labs.exercises()
    for path in NOTEBOOKS:
        text = "".join(c.source for c in nbformat.read(path, as_version=4).cells)
        order = [k for k in exercises if f'labs.check("{k}"' in text]
        order.sort(key=lambda k: text.index(f'labs.check("{k}"'))
        estimates = [k for k in order if exercises[k].is_estimate]
        assert estimates, f"{path.name} has no exercise in three steps"
        for key in estimates:
            i = order.index(key)
            exact, why = order[i + 1], order[i + 2]
            assert exercises[exact].expected is exercises[key].expected, (key, exact)
            assert exercises[why].is_choice, (key, why)


def test_choices_take_one_letter_in_any_case_and_refuse_the_rest():
    ex = labs.exercises()["ch3.host_why"]
    right = ex.expected()
    for answer in (right, right.upper(), f"({right})", f" {right} "):
        assert labs.check(ex.key, answer).passed, answer
    wrong = labs.check(ex.key, next(o for o in ex.options if o != right))
    assert not wrong.passed and "is not the reason" in wrong.message and ex.hint in wrong.message
    for nonsense in ("z", "ab", 2, 0.5):
        result = labs.check(ex.key, nonsense)
        assert not result.passed and "one letter" in result.message
    blank = labs.check(ex.key, ...)
    assert not blank.passed and '"a", "b" or "c"' in blank.message and "Hint" in blank.message


def test_the_why_answers_follow_from_kvlab_where_a_number_decides():
    """The letters kvlab computes: the premise of each question holds in the ledger."""

    for key in (
        "ch1.ttft_why",
        "ch2.int4_why",
        "ch2b.measured_why",
        "ch2c.tp_why",
        "ch3.host_why",
        "ch4.remote_why",
        "ch5.knee_why",
    ):
        assert labs.exercises()[key].expected() in "ab", key
    int4 = cost.decode_step(Deployment("article-7b", "h100-sxm", "int4"), 8, 16384)
    assert int4.kv_read_bytes > 4 * int4.weight_read_bytes  # the KV is most of the bytes


def test_wrong_missing_and_nonsense_answers_get_hints():
    ex = labs.exercises()["ch1.ceiling"]
    wrong = labs.check("ch1.ceiling", ex.expected() * 0.5)
    assert not wrong.passed and "too low" in wrong.message and "weight bytes" in wrong.message
    blank = labs.check("ch1.ceiling", ...)
    assert not blank.passed and "not answered yet" in blank.message and "Hint" in blank.message
    assert not labs.check("ch1.ceiling", "lots").passed
    assert not labs.check("ch1.ceiling", float("nan")).passed
    with pytest.raises(ValueError, match="ch1.ceiling"):
        labs.check("ch1.ceilin", 1)


def test_blanking_keeps_indentation_and_only_touches_answer_lines():
    src = "x = 1\n    answer = 2 * x  # ANSWER\nanswer_key = 3\n"
    assert (
        labs.blank_answers(src) == "x = 1\n    answer = ...  # your answer here\nanswer_key = 3\n"
    )
    multi = "answer = (a\n          / b)  # ANSWER\ncheck()\n"
    assert labs.blank_answers(multi) == "answer = ...  # your answer here\ncheck()\n"


def test_every_chapter_notebook_with_a_lab_is_complete():
    keys = set()
    for path in NOTEBOOKS:
        text = "".join(c.source for c in nbformat.read(path, as_version=4).cells)
        keys |= {k for k in labs.exercises() if f'labs.check("{k}"' in text}
    assert keys == set(labs.exercises())  # each exercise appears in a chapter


@pytest.mark.notebook
def test_student_copies_fail_with_hints(tmp_path):
    """Every student copy runs to its end, and each of its checks says FAIL with a hint.

    The copies run one after another in one kernel, each from `%reset -f`, which empties the
    namespace as a new kernel would (a copy that needs a name its own cells no longer define
    still fails): starting a kernel and importing kvlab, bokeh and the widgets took most of
    the time of a copy's run, once per chapter."""
    written = labs.write_student_copies(NOTEBOOKS, tmp_path)
    assert written
    one = nbformat.v4.new_notebook(metadata=nbformat.read(written[0], as_version=4).metadata)
    copy_of = []  # the student copy each cell of `one` comes from
    for path in written:
        nb = nbformat.read(path, as_version=4)
        assert "# ANSWER" not in "".join(c.source for c in nb.cells)
        code = [c for c in nb.cells if c.cell_type == "code"]
        one.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        one.cells += [nbformat.v4.new_code_cell(c.source, metadata=c.metadata) for c in code]
        copy_of += [path] * (1 + len(code))
    client = NotebookClient(
        one,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = next(p for c, p in zip(one.cells, copy_of, strict=True) if _raised(c))
        pytest.fail(f"the student copy {failed.name} does not run: {exc}")
    for path in written:
        checks = [
            o
            for c, p in zip(one.cells, copy_of, strict=True)
            if p == path and "labs.check" in c.source
            for o in c.outputs
            if "text/plain" in o.get("data", {})
        ]
        assert checks, path
        for output in checks:
            text = output["data"]["text/plain"]
            assert text.startswith("FAIL") and "Hint" in text, text


def _raised(cell) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def test_labs_tool_copies_notebooks_of_any_name_and_says_when_none_holds_a_lab(tmp_path, capsys):
    src, out = tmp_path / "nb", tmp_path / "labs"
    src.mkdir()
    chapter = next(p for p in NOTEBOOKS if p.name.startswith("01_"))
    (src / "my_lab.ipynb").write_bytes(chapter.read_bytes())  # no leading digit
    assert _run(str(src), str(out)) == 0
    assert [p.name for p in out.iterdir()] == ["my_lab.ipynb"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(str(empty), str(tmp_path / "o1")) == 2
    assert "holds no notebook (*.ipynb)" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, str(plain / "notes.ipynb"))
    assert _run(str(plain), str(tmp_path / "o2")) == 2
    err = capsys.readouterr().err
    assert "none of the 1 notebooks in" in err and "# ANSWER" in err


def test_answers_are_hidden_in_the_built_book():
    """Every exercise cell carries the `hide-cell` tag: the built book shows a toggle, not the
    answer (nbval still runs the cell and checks its verdict)."""
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and labs.ANSWER_MARK in cell.source:
                assert "hide-cell" in cell.metadata.get("tags", []), (path.name, cell.source[:60])


def test_reference_answers_pass(monkeypatch):
    """Each chapter's reference answers, run in order as a reader would, pass their checks
    (also where a chapter's data depend on which trace this machine has)."""
    real_check, results = labs.check, []

    def recording_check(key, answer):
        result = real_check(key, answer)
        results.append(result)
        return result

    monkeypatch.setattr(labs, "check", recording_check)
    for path in NOTEBOOKS:
        namespace: dict = {}
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "labs.check(" in cell.source:
                exec(compile(cell.source, f"{path.name}:lab", "exec"), namespace)
    assert {r.key for r in results} == set(labs.exercises())
    assert all(r.passed for r in results), [r for r in results if not r.passed]


# ------------------------------------------------------------------ python -m kvlab.labs guards


def _copy_chapters(tmp_path):
    src = tmp_path / "nb"
    src.mkdir()
    for path in NOTEBOOKS:
        (src / path.name).write_bytes(path.read_bytes())
    return src


def _run(*argv):
    return guarded(labs.main, "kvlab labs", list(argv))


@pytest.mark.parametrize("out", [".", "sub", "sub/deeper"])
def test_refuses_to_write_into_the_notebook_folder(tmp_path, capsys, out):
    src = _copy_chapters(tmp_path)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    assert _run(str(src), str(src / out)) == 2
    assert "would replace the reference answers" in capsys.readouterr().err
    # nothing blanked, nothing cleared
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_never_overwrites_without_force(tmp_path, capsys):
    src, out = _copy_chapters(tmp_path), tmp_path / "labs"
    assert _run(str(src), str(out)) == 0
    written = sorted(out.iterdir())
    umask = os.umask(0)
    os.umask(umask)
    # ordinary files: 0644 under umask 022
    assert written and all(p.stat().st_mode & 0o777 == 0o666 & ~umask for p in written)
    student = written[0]
    # a student's work
    student.write_text(student.read_text().replace("answer = ...", "answer = 42"))
    kept = student.read_bytes()
    capsys.readouterr()
    assert _run(str(src), str(out)) == 2
    err = capsys.readouterr().err
    assert "exists (it may hold a student's answers); pass --force" in err and err.count("\n") == 1
    assert student.read_bytes() == kept
    assert _run(str(src), str(out), "--force") == 0 and student.read_bytes() != kept


def test_a_file_as_output_a_symlink_back_and_a_malformed_notebook(tmp_path, capsys):
    src = _copy_chapters(tmp_path)
    (tmp_path / "file").write_text("x")
    assert _run(str(src), str(tmp_path / "file")) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    out = tmp_path / "out"
    out.mkdir()
    (out / NOTEBOOKS[0].name).symlink_to(src / NOTEBOOKS[0].name)
    assert _run(str(src), str(out), "--force") == 2  # even --force never writes over a source
    assert "over the notebook it comes from" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "01_x.ipynb").write_text("{not json")
    assert _run(str(bad), str(tmp_path / "fresh")) == 2
    err = capsys.readouterr().err
    assert "01_x.ipynb is not a readable notebook" in err and err.count("\n") == 1
    assert not (tmp_path / "fresh").exists()
    assert _run(str(tmp_path / "missing"), str(tmp_path / "o")) == 2
