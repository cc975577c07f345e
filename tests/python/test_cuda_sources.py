"""A check of the CUDA sources that needs no GPU: no warp collective (ours all name the full warp in
their mask) is evaluated by only some lanes because it stands on the conditional side of `&&`, `||`
or `?:`.

Such a call (e.g. `e != INT_MAX && __match_any_sync(0xFFFFFFFFu, e)`) compiles to a branch around
the collective; the lanes that skip it never arrive, and the warp hangs (perf-log v34: every decode
call of the early FC1 instance hung on the GPU this way). Collectives in the arguments of another
call, or before the operator, are evaluated by every lane and pass."""

import pathlib
import re

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
COLLECTIVE = re.compile(r"__(shfl|shfl_xor|shfl_up|shfl_down|ballot|match_any|match_all|any|all|uni|reduce_\w+)_sync\s*\(")


def strip_comments(text: str) -> str:
    """The source with comments and string literals blanked (newlines kept, for line numbers)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, text, flags=re.S)


def conditional_collectives(text: str):
    """(line, statement) for each collective to the right of `&&`, `||` or `?` in its own
    expression: walking back from the call, an operator met before a `,`, `;`, `{`, `}` or `=` of
    its level, or the `(` of a condition, makes the call conditional (an enclosing call or grouping
    is one term of its own level)."""
    code = strip_comments(text)
    found = []
    for m in COLLECTIVE.finditer(code):
        depth, i = 0, m.start() - 1
        while i >= 0:
            c = code[i]
            if c == ")":
                depth += 1
            elif c == "(":
                if depth == 0:
                    # Leaving a parenthesis: an if / while / for / switch condition is the whole
                    # expression; a call or a grouping holding this one is evaluated as one term,
                    # so its own place decides.
                    word = re.search(r"(\w*)\s*$", code[:i]).group(1)
                    if word in ("if", "while", "for", "switch"):
                        break
                else:
                    depth -= 1
            elif depth == 0:
                if c in ";{},":
                    break
                if c == "=" and code[i - 1] not in "=!<>" and code[i + 1] != "=":
                    break  # an assignment's right side starts here
                if c == "?" or code[i - 1 : i + 1] in ("&&", "||"):
                    line = code.count("\n", 0, m.start()) + 1
                    found.append((line, code[i - (c != "?") : m.end()].strip()))
                    break
            i -= 1
    return found


def test_detector_finds_the_v34_hang_and_passes_its_fix():
    bad = "const bool first = e != INT_MAX && __ffs(__match_any_sync(kAll, e)) - 1 == lane;"
    assert len(conditional_collectives(bad)) == 1
    assert len(conditional_collectives("int v = ok ? __shfl_sync(kAll, e, 0) : -1;")) == 1
    assert len(conditional_collectives("if (a || __any_sync(kAll, b)) x();")) == 1
    fixed = """const unsigned same = __match_any_sync(kAll, e);
               const bool first = e != INT_MAX && __ffs(same) - 1 == lane;
               const unsigned hit = __ballot_sync(kAll, first && rank == tile);
               if (__shfl_sync(kAll, key, pos) < e) pos += 1;  // a && b ? c
               v = (lower == ascending) == (v < o) ? v : __shfl_xor_sync(kAll, v, 1) * 0 + o;"""
    # (the last line is conditional: the detector must say so)
    assert [line for line, _ in conditional_collectives(fixed)] == [5]


def test_no_collective_is_evaluated_by_only_some_lanes():
    files = sorted(p for p in SRC.rglob("*") if p.suffix in (".cu", ".cuh"))
    assert files, f"no CUDA sources under {SRC}"
    offenders = [
        f"{p.relative_to(SRC.parent)}:{line}: {stmt}"
        for p in files
        for line, stmt in conditional_collectives(p.read_text())
    ]
    assert not offenders, "warp collectives on the conditional side of &&, || or ?:\n" + "\n".join(offenders)
