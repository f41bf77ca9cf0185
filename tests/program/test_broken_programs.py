"""Every broken program in programs/ is refused with exactly the one-line message its first line
announces (`# expect: <function>: <problem>`, after `<file>: `), and nothing is loaded."""

from pathlib import Path

import pytest

from ramen.program import ProgramError, load

PROGRAMS = Path(__file__).parent / "programs"
EXPECT_PREFIX = "# expect: "
BROKEN = sorted(PROGRAMS.glob("*.toml"))


def expected_message(path: Path) -> str:
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith(EXPECT_PREFIX), f"{path.name} does not say what it expects"
    return f"{path}: {first_line[len(EXPECT_PREFIX):]}"


def test_there_are_enough_broken_programs():
    assert len(BROKEN) >= 12


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_program_is_refused_with_one_exact_line(path):
    with pytest.raises(ProgramError) as caught:
        load(path)
    message = str(caught.value)
    assert message == expected_message(path)
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_the_error_says_which_file_function_and_problem(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[program]\nname = "p"\n[[function]]\nname = "f"\nfrom = ["g"]\nengine = "spark"\nsql = "x"\n')
    with pytest.raises(ProgramError) as caught:
        load(path)
    assert (caught.value.file, caught.value.function, caught.value.problem) == (str(path), "f", "unknown parent 'g'")


def test_a_missing_file_is_a_program_error(tmp_path):
    with pytest.raises(ProgramError, match=r"nope.toml: cannot read: No such file or directory$"):
        load(tmp_path / "nope.toml")


def test_toml_nested_past_the_parsers_recursion_is_one_line(tmp_path):
    for nested in ("[" * 5000 + "]" * 5000, "{b = " * 5000 + "1" + "}" * 5000):
        path = tmp_path / "deep.toml"
        path.write_text(f"a = {nested}\n")
        with pytest.raises(ProgramError, match=r"deep.toml: invalid TOML: arrays or inline tables nested too deeply$"):
            load(path)
