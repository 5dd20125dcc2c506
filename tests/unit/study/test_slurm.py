"""What the Slurm executor hands to sbatch (issue 28): the job script submitit renders from the study file's
``executor.slurm``, read as sbatch reads it. No cluster is needed: submitit renders the script before it calls
sbatch (``SlurmExecutor._make_submission_file_text``), and only its check that ``srun`` exists is bypassed."""

from __future__ import annotations

import pytest
import submitit
from submitit.slurm.slurm import SlurmExecutor

from mtft.study.slurm import slurm_parameters
from mtft.study.spec import SlurmSection

HOSTILE = """gpu a; $(touch /tmp/x) `id` "dq" 'sq' #not-a-comment &&|>"""


def sbatch_arguments(text: str) -> list[str]:
    """The arguments sbatch takes from the text after ``#SBATCH``: whitespace-separated, ' and " quote, a backslash
    escapes the next character (inside quotes too), an unquoted # starts a comment; nothing is expanded (Slurm,
    src/sbatch/opt.c, ``_get_argument``)."""
    arguments, i = [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            break
        argument, quote, escaped = "", None, False
        while i < len(text) and (quote or not text[i].isspace()):
            char, i = text[i], i + 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = None
                    continue
            elif char in "'\"":
                quote = char
                continue
            elif char == "#":
                return arguments + ([argument] if argument else [])
            argument += char
        assert quote is None, f"unmatched {quote} in {text!r}: sbatch refuses the script"
        arguments.append(argument)
    return arguments


def test_sbatch_arguments_reads_as_slurm_does():
    assert sbatch_arguments(" --a=x y # c") == ["--a=x", "y"]
    assert sbatch_arguments(""" --a='x y'"z"\\"w\\ v""") == ['--a=x yz"w', "v"]  # an escaped space still splits


def rendered_script(tmp_path, monkeypatch, slurm: SlurmSection) -> str:
    monkeypatch.setattr(SlurmExecutor, "affinity", staticmethod(lambda: 1))  # "srun is on PATH"
    executor = submitit.AutoExecutor(folder=str(tmp_path), cluster="slurm")
    executor.update_parameters(**slurm_parameters(slurm, executor.cluster))
    inner = executor._executor
    return inner._make_submission_file_text(inner._submitit_command_str, "uid")


def test_each_option_reaches_sbatch_as_one_literal_value_and_no_shell(tmp_path, monkeypatch):
    slurm = SlurmSection(partition=HOSTILE, additional={"comment": HOSTILE, "mail_type": "END,FAIL", "exclusive": True})
    script = rendered_script(tmp_path, monkeypatch, slurm)
    options = {}
    for line in script.splitlines():
        if "touch" in line:
            assert line.startswith("#SBATCH "), line  # a comment to bash: no shell reads the value
        if line.startswith("#SBATCH"):
            [argument] = sbatch_arguments(line[len("#SBATCH") :])  # one argument per line
            key, _, value = argument.partition("=")
            options[key] = value
    assert options["--partition"] == HOSTILE and options["--comment"] == HOSTILE
    assert options["--mail-type"] == "END,FAIL" and options["--exclusive"] == ""
    assert options["--time"] == "60" and options["--job-name"] == "mtft-study"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"partition": "gpu\\ a"}, "must not hold a backslash"),
        ({"additional": {"comment": "a\\b"}}, "must not hold a backslash"),
        ({"additional": {"comment x": "a"}}, "is not an sbatch option name"),
        ({"additional": {"a=b": "c"}}, "is not an sbatch option name"),
        ({"additional": {"--qos": "high"}}, "is not an sbatch option name"),
    ],
)
def test_what_the_quoting_cannot_carry_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        SlurmSection(**fields)
