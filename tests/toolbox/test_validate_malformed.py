"""The malformed-document corpus: each document gives exactly its one expected finding, exit 1, no traceback.

Each case is a folder under tests/toolbox/malformed/ overlaid on a copy of the valid tree
(tests/toolbox/malformed/valid-tree). Files that cannot be committed (10 MB, non-UTF-8 bytes,
symlinks out of the repository) are made at test time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MALFORMED

SKILL = "knowledge/attention/demo-skill/SKILL.md"
METHOD = "knowledge/method/demo-method/SKILL.md"
COPY = "contracts/attention/demo-copy.yaml"
COPY_PY = "contracts/attention/demo-copy.py"

# case -> (file, line, field, message fragment, severity)
EXPECTED: dict[str, tuple[str, int | None, str, str, str]] = {
    "yaml-broken": (SKILL, 5, "", "invalid YAML", "error"),
    "yaml-tab-indent": (SKILL, 7, "", "tab character in indentation", "error"),
    "yaml-duplicate-key": (SKILL, 5, "license", "duplicate key 'license' (first defined at line 4)", "error"),
    "yaml-duplicate-key-contract": (COPY, 4, "title", "duplicate key 'title'", "error"),
    "yaml-merge-key": (COPY, 11, "", "merge keys", "error"),
    "yaml-alias-bomb": (COPY, 2, "", "more than 8 YAML aliases", "error"),
    "yaml-python-tag": (COPY, 8, "", "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed", "error"),
    "empty-file": (SKILL, 1, "", "file is empty", "error"),
    "frontmatter-not-closed": (SKILL, 1, "frontmatter", "frontmatter is not closed", "error"),
    "frontmatter-missing": (SKILL, 1, "frontmatter", "must start with a line `---`", "error"),
    "skill-unknown-top-level-key": (SKILL, 5, "version", "unknown top-level key `version`", "error"),
    "skill-unknown-metadata-key": (SKILL, 8, "metadata.owner", "unknown key `owner`", "error"),
    "skill-name-folder-mismatch": (SKILL, 2, "name", "name `demo-skills` differs from its folder `demo-skill`", "error"),
    "skill-name-too-long": (SKILL, 2, "name", "at most 64 characters (it has 71)", "error"),
    "skill-name-not-kebab": (SKILL, 2, "name", "'Demo_Skill' does not have the required form", "error"),
    "skill-description-too-long": (SKILL, 3, "description", "at most 1024 characters", "error"),
    "skill-description-angle-brackets": (SKILL, 3, "description", "angle brackets", "error"),
    "skill-metadata-not-string": (SKILL, 12, "metadata.updated", "metadata values must be strings", "error"),
    "skill-version-not-semver": (SKILL, 6, "metadata.version", "'1.1' does not have the required form", "error"),
    "skill-status-unknown": (SKILL, 7, "metadata.status", "got 'final'", "error"),
    "skill-missing-required": (SKILL, 5, "metadata.applies-to", "required field `applies-to` is missing", "error"),
    "skill-domain-mismatch": (SKILL, 8, "metadata.domain", "domain `moe` differs from the folder", "error"),
    "skill-dangling-contract": (SKILL, 9, "metadata.contracts", "contract `attention/demo-cpy` does not exist", "error"),
    "skill-dangling-requires": (METHOD, 9, "metadata.requires", "required skill `ghost-skill` does not exist", "error"),
    "skill-contract-not-pointing-back": (SKILL, 9, "metadata.contracts",
                                         "contract `attention/demo-scale` does not list skill `demo-skill`", "error"),
    "skill-duplicate-name": ("knowledge/method/demo-skill/SKILL.md", 2, "name",
                             f"skill name `demo-skill` is also used by {SKILL}", "error"),
    "skill-missing-changelog-entry": (SKILL, 23, "changelog", "no entry for the current version 1.2.0", "error"),
    "skill-no-changelog": (SKILL, 21, "changelog", "does not end with a `## Changelog` section", "error"),
    "skill-changelog-not-last": (SKILL, 28, "changelog", "`## Appendix` follows it", "error"),
    "skill-missing-bundled-file": (SKILL, 17, "body", "mentions `references/derivation.md`, which is not a file", "error"),
    "skill-rejected-by-skills-ref": (METHOD, 1, "frontmatter", "skills-ref validate: Invalid YAML in frontmatter", "error"),
    "skill-body-too-long": (SKILL, 514, "body", "body has 532 lines, over 500", "warning"),
    "contract-wrong-type": (COPY, 33, "cases[0].seed", "valid integer", "error"),
    "contract-unknown-field": (COPY, 9, "author", "unknown key `author`", "error"),
    "contract-id-not-path": (COPY, 1, "id", "id `attention/demo-copying` does not match its path", "error"),
    "contract-duplicate-id": ("contracts/attention/demo-twin.yaml", 1, "id",
                              "`attention/demo-copy` is already the id of contracts/attention/demo-copy.yaml", "error"),
    "contract-version-not-semver": (COPY, 2, "version", "'1.0' does not have the required form", "error"),
    "contract-dangling-skill": (COPY, 7, "skills[1]", "skill `ghost-skill` does not exist", "error"),
    "contract-skill-not-pointing-back": (COPY, 7, "skills[1]",
                                         "skill `demo-method` does not list contract `attention/demo-copy`", "error"),
    "contract-missing-changelog-entry": (COPY, 46, "changelog", "no entry for the current version 1.1.0", "error"),
    "contract-missing-function": (COPY, 30, "invariants[0]", "function `finite_outputs` is not defined", "error"),
    "contract-missing-mutate": (COPY, 39, "errors[0].mutate", "function `drop_x` is not defined", "error"),
    "contract-missing-python": (COPY, 1, "reference", "contracts/attention/demo-copy.py does not exist", "error"),
    "contract-python-syntax-error": (COPY_PY, 25, "", "Python syntax error", "error"),
    "contract-python-forbidden-import": (COPY_PY, 9, "imports", "imports `toolbox.expressions`", "error"),
    "contract-unknown-axis-in-shape": (COPY, 18, "inputs.x.shape", "names unknown axis `D`", "error"),
    "contract-unknown-axis-in-roofline": (COPY, 44, "roofline.bytes", "names unknown axis `hidden`", "error"),
    "contract-case-unknown-axis": (COPY, 34, "cases[0].axes", "sets unknown axis `B`", "error"),
    "contract-case-missing-axis": (COPY, 34, "cases[0].axes", "gives no value for variable axis `T`", "error"),
    "contract-case-violates-constraint": (COPY, 32, "cases[0]", "violates constraint `H % 16 == 0` (H=24)", "error"),
    "contract-bad-expression": (COPY, 25, "constraints[0]", "bad expression", "error"),
    "contract-constraint-uses-param": (COPY, 31, "constraints[1]", "names param `scale`; it is evaluated with axis values only",
                                       "error"),
    "contract-not-a-mapping": (COPY, 1, "(document)", "not a mapping", "error"),
}
DELETIONS = {"contract-missing-python": [COPY_PY]}


def build_case(case: str, tree: Path) -> None:
    """Overlay the case on the tree; `X.broken` lands as `X` (invalid Python is not committed as .py, so linters pass)."""
    shutil.copytree(MALFORMED / case, tree, dirs_exist_ok=True, ignore=shutil.ignore_patterns("README"))
    for broken in tree.rglob("*.broken"):
        broken.replace(broken.with_suffix(""))
    for relative in DELETIONS.get(case, []):
        (tree / relative).unlink()


def test_corpus_is_complete() -> None:
    on_disk = {p.name for p in MALFORMED.iterdir() if p.is_dir() and p.name not in ("valid-tree", "__pycache__")}
    assert on_disk == set(EXPECTED), "every folder in malformed/ needs an expected finding, and the reverse"
    assert len(EXPECTED) >= 25


def test_valid_tree_is_clean(valid_tree: Path, toolbox_cli) -> None:
    result = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "0 error(s), 0 warning(s) in 2 skill(s) and 2 contract(s)"


def assert_one_finding(result, expected: tuple[str, int | None, str, str, str]) -> None:
    file, line, field, fragment, severity = expected
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    lines = result.stdout.strip().split("\n")
    assert len(lines) == 2, f"expected exactly one finding and the summary:\n{result.output}"
    finding, summary = lines
    where = f"{file}:{line}: " if line is not None else f"{file}: "
    assert finding.startswith(where + f"{severity}: "), finding
    if field:
        assert finding.startswith(f"{where}{severity}: {field}: "), finding
    assert fragment in finding, finding
    assert "(hint: " in finding, "every finding suggests a fix"
    assert summary.startswith("1 error(s), 0 warning(s)" if severity == "error" else "0 error(s), 1 warning(s)")


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_malformed_document(case: str, valid_tree: Path, toolbox_cli) -> None:
    build_case(case, valid_tree)
    result = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert_one_finding(result, EXPECTED[case])
    as_json = toolbox_cli("validate", "--strict", "--format", "json", cwd=valid_tree)
    assert as_json.exit_code == 1
    records = json.loads(as_json.stdout)
    file, line, field, fragment, severity = EXPECTED[case]
    assert len(records) == 1
    assert set(records[0]) == {"file", "line", "field", "severity", "message", "hint"}
    assert (records[0]["file"], records[0]["line"], records[0]["field"], records[0]["severity"]) == (file, line, field, severity)
    assert fragment in records[0]["message"]


def test_body_too_long_is_only_a_warning_without_strict(valid_tree: Path, toolbox_cli) -> None:
    build_case("skill-body-too-long", valid_tree)
    result = toolbox_cli("validate", cwd=valid_tree)
    assert result.exit_code == 0, result.output
    assert "warning: body:" in result.output


def test_finding_limited_to_requested_path(valid_tree: Path, toolbox_cli) -> None:
    build_case("skill-dangling-requires", valid_tree)
    clean = toolbox_cli("validate", "knowledge/attention", cwd=valid_tree)
    assert clean.exit_code == 0, clean.output
    dirty = toolbox_cli("validate", METHOD, cwd=valid_tree)
    assert dirty.exit_code == 1 and "ghost-skill" in dirty.output


# --- documents that cannot be committed: made at test time --------------------------------------------------


def test_ten_megabyte_file(valid_tree: Path, toolbox_cli) -> None:
    with open(valid_tree / COPY, "ab") as handle:
        handle.write(b"# padding\n" * 1_000_000)
    result = toolbox_cli("validate", cwd=valid_tree)
    assert_one_finding(result, (COPY, None, "", "over the 1,048,576-byte limit", "error"))


def test_non_utf8_bytes(valid_tree: Path, toolbox_cli) -> None:
    path = valid_tree / SKILL
    path.write_bytes(path.read_bytes().replace(b"copies a tensor", b"copies a \xff\xfe tensor"))
    result = toolbox_cli("validate", cwd=valid_tree)
    assert_one_finding(result, (SKILL, 3, "", "bytes that are not UTF-8 (byte 0xff", "error"))


def test_symlink_outside_repository_is_not_read(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    secret = tmp_path / "outside.yaml"
    secret.write_text("id: attention/demo-link\nsecret: do-not-read\n")
    os.symlink(secret, valid_tree / "contracts/attention/demo-link.yaml")
    result = toolbox_cli("validate", cwd=valid_tree)
    assert_one_finding(result, ("contracts/attention/demo-link.yaml", None, "", "symlink points outside the repository", "error"))
    assert "do-not-read" not in result.output
    explicit = toolbox_cli("validate", "contracts/attention/demo-link.yaml", cwd=valid_tree)
    assert_one_finding(explicit, ("contracts/attention/demo-link.yaml", None, "", "symlink points outside", "error"))


def test_symlinked_folder_outside_repository(valid_tree: Path, tmp_path: Path, toolbox_cli) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(valid_tree / "knowledge/method", outside)
    os.symlink(outside, valid_tree / "knowledge/serving", target_is_directory=True)
    result = toolbox_cli("validate", cwd=valid_tree)
    assert_one_finding(result, ("knowledge/serving", None, "", "symlink points outside the repository", "error"))


def test_orphan_python_half(valid_tree: Path, toolbox_cli) -> None:
    shutil.copy(valid_tree / COPY_PY, valid_tree / "contracts/attention/leftover.py")
    assert toolbox_cli("validate", cwd=valid_tree).exit_code == 0
    result = toolbox_cli("validate", "--strict", cwd=valid_tree)
    assert_one_finding(result, ("contracts/attention/leftover.py", None, "", "executable half without a contract",
                                "warning"))


def test_symlink_loop(valid_tree: Path, toolbox_cli) -> None:
    os.symlink("loop-b.yaml", valid_tree / "contracts/attention/loop-a.yaml")
    os.symlink("loop-a.yaml", valid_tree / "contracts/attention/loop-b.yaml")
    result = toolbox_cli("validate", "--format", "json", cwd=valid_tree)
    assert result.exit_code == 1, result.output
    records = json.loads(result.stdout)
    assert [(r["file"], r["message"]) for r in records] == [
        ("contracts/attention/loop-a.yaml", "symlink loop; not read"),
        ("contracts/attention/loop-b.yaml", "symlink loop; not read"),
    ]


def test_alias_bomb_is_refused_fast(valid_tree: Path, toolbox_cli) -> None:
    import time

    build_case("yaml-alias-bomb", valid_tree)
    start = time.perf_counter()
    result = toolbox_cli("validate", COPY, cwd=valid_tree)
    assert time.perf_counter() - start < 10  # a bound on runaway expansion (9**7 items), not a speed claim
    assert result.exit_code == 1


@pytest.mark.parametrize("case", ["yaml-alias-bomb", "contract-python-syntax-error", "frontmatter-not-closed"])
def test_subprocess_has_no_traceback(case: str, valid_tree: Path) -> None:
    build_case(case, valid_tree)
    result = subprocess.run([sys.executable, "-m", "toolbox.cli", "validate"], cwd=valid_tree, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    findings = [line for line in result.stdout.strip().split("\n")[:-1]]
    assert len(findings) == 1 and findings[0].startswith(EXPECTED[case][0])
