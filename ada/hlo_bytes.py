"""Where a compiled program's bytes go: the optimized HLO's ops, each costed by XLA's own
model, split by memory space, so HBM traffic can be put beside an analytic floor
(ada.planner) and a regression shows the op that moves the bytes (`ada.plan --explain`).

Why not `cost_analysis()["bytes accessed"]` alone: it sums every operand and result of every
op in every memory space. On TPU the compiler stages weights and cache blocks through
on-chip memory, so each staged byte is counted two or three times, though only the HBM read
is bound by HBM bandwidth.
"""

from __future__ import annotations

import math
import re

import jax

EXPLAIN_GROUPS = 40  # op groups kept in the plan (--explain prints the first N)
DTYPE_BYTES = dict(pred=1, s4=1, u4=1, s8=1, u8=1, f8e4m3fn=1, f8e5m2=1, s16=2, u16=2, f16=2,
                    bf16=2, s32=4, u32=4, f32=4, s64=8, u64=8, f64=8)
_SHAPE = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
HEAD = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\) -> .*\{$")
INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "conditional",
         "call", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency"}
ON_CHIP = "S(1)"  # the TPU's on-chip memory space (VMEM) in an optimized HLO layout


def _shape_bytes(text: str) -> int:
    return sum(DTYPE_BYTES[m.group(1)] * math.prod(int(d) for d in m.group(2).split(",") if d)
               for m in _SHAPE.finditer(text))


def _operands(rest: str) -> tuple[list[str], str]:
    """An instruction's operand names and its attributes (the text after the operands)."""
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "([{"
        if ch in ")]}":
            if depth == 0:
                names = [re.sub(r"/\*.*?\*/", "", a).strip().lstrip("%")
                         for a in rest[:i].split(",")]
                return [n.split()[-1] for n in names if n], rest[i + 1:]
            depth -= 1
    return [], rest


def _op_cost(module_text: str) -> dict | None:
    """XLA's HloCostAnalysis of a module (the model behind `cost_analysis()`), through the
    CPU client; None where this jaxlib cannot (a private API: jax is pinned)."""
    try:
        import jaxlib._hlo as hlo  # noqa: PLC0415
        from jax._src.lib import _jax  # noqa: PLC0415

        return _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client,
                                             hlo.hlo_module_from_text(module_text))
    except Exception:  # noqa: BLE001 (any failure: fall back to the shapes)
        return None


def hlo_op_bytes(hlo_text: str) -> list[dict]:
    """The bytes every top-level op of an optimized HLO module reads and writes, and how many
    of them are in HBM.

    `cost_analysis()["bytes accessed"]` sums every operand and result of every op in every
    memory space. On TPU the compiler stages weights and cache blocks through on-chip memory
    (layout memory space S(1)): an async slice or copy reads HBM and writes on-chip memory,
    then the consumer reads on-chip memory, and each staged byte is counted two or three
    times, though only the HBM read is bound by HBM bandwidth. Here each op is costed alone
    (a one-op module through XLA's own cost model; async copies and slices as what they move)
    and its operands and result are split by the memory space their layouts name:
    `hbm_bytes` counts only those in HBM. Loop bodies count once (as XLA's total does);
    custom calls (kernels) count their operands and results whole, as XLA cannot see in.
    `loop`: the op is inside a while loop (runs once per trip, e.g. per decode step).
    `costing`: how its bytes were counted: "xla" (the cost model), "move" (an async copy or
    slice: what it moves), "kernel" (a custom call: operands and result whole) or "shapes"
    (the cost model failed: operands and result whole; `costings` counts them)."""
    comps: dict[str, list] = {}  # computation -> its instructions
    text_of: dict[str, list] = {}  # computation -> its lines
    roots: dict[str, str] = {}  # computation -> its root's opcode
    cur = None
    for line in hlo_text.splitlines():
        if head := HEAD.match(line):
            cur = head.group(1)
            comps[cur], text_of[cur] = [], [line]
        elif cur is not None:
            text_of[cur].append(line)
            if line.startswith("}"):
                cur = None
            elif m := INSTR.match(line):
                comps[cur].append((m.group(1), m.group(2), m.group(3), *_operands(m.group(4))))
                if line.lstrip().startswith("ROOT "):
                    roots[cur] = m.group(3)
    nested = set()  # fusion bodies and reducers: costed as part of their caller
    loops: set[str] = set()  # while bodies and conditions, and what they call
    for body in comps.values():
        for _, _, op, _, attrs in body:
            if op != "call":
                nested.update(re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", attrs))
            if op == "while":
                loops.update(re.findall(r"(?:body|condition)=%?([\w.\-]+)", attrs))
    grow = list(loops)
    while grow:
        for *_, attrs in comps.get(grow.pop(), []):
            for c in re.findall(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)", attrs):
                if c not in loops:
                    loops.add(c)
                    grow.append(c)

    def callees(attrs, seen):
        for c in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", attrs):
            if c in comps and c not in seen:
                seen.add(c)
                for *_, a in comps[c]:
                    callees(a, seen)
        return seen


    def strip(text):  # metadata and backend configs (nested braces) are not costed
        out, i = [], 0
        for m in re.finditer(r",?\s*(?:metadata|backend_config|frontend_attributes)=", text):
            if m.start() < i:
                continue
            out.append(text[i:m.start()])
            j, depth = m.end(), 0
            while j < len(text):
                depth += text[j] == "{"
                depth -= text[j] == "}"
                j += 1
                if depth == 0 and (text[j - 1] == "}" or text[j:j + 1] in (",", "\n", "")):
                    break
            i = j
        return "".join(out) + text[i:]

    rows = []
    for cname, body in comps.items():
        if cname in nested:
            continue
        types = {name: rtype for name, rtype, *_ in body}
        for name, rtype, op, operands, attrs in body:
            if op in _FREE or op.endswith("-done") or (
                    op == "custom-call" and "ConcatBitcast" in attrs):  # an on-chip view
                continue
            meta = re.search(r'op_name="([^"]*)"', attrs)
            callee = re.search(r"calls=%?([\w.\-]+)", attrs)
            root = roots.get(callee.group(1)) if callee and op == "fusion" else None
            opnd = [types.get(o, "") for o in operands]
            if op.endswith("-start") and (inner := re.match(
                    r"\(\(?(.*?)\)?, (\w+\[[\d,]*\]\{[^}]*\}), [us]32\[\]", rtype)):
                src, dst = inner.group(1), inner.group(2)  # moves dst's bytes from src to dst
                moved = _shape_bytes(dst)
                parts, costing = [(moved, src), (moved, dst)], "move"
            else:
                cost = None
                if op != "custom-call":
                    need = callees(attrs, set())
                    params = "\n".join(f"  p{i} = {t} parameter({i})" for i, t in enumerate(opnd))
                    call = re.sub(r",?\s*control-predecessors=\{[^}]*\}", "", strip(attrs))
                    cost = _op_cost("HloModule one\n\n" + "\n\n".join(
                        strip("\n".join(text_of[c])) for c in text_of if c in need)
                        + f"\n\nENTRY e {{\n{params}\n  ROOT r = {rtype} {op}("
                        + ", ".join(f"p{i}" for i in range(len(opnd))) + f"){call}\n}}\n")
                if cost and cost.get("bytes accessed", -1) >= 0:
                    out = sum(v for k, v in cost.items() if k.startswith("bytes accessedout"))
                    parts = [(cost.get(f"bytes accessed{i}{{}}", 0.0), t)
                             for i, t in enumerate(opnd)] + [(out, rtype)]
                    costing = "xla"
                else:
                    parts = [(_shape_bytes(t), t) for t in opnd] + [(_shape_bytes(rtype), rtype)]
                    costing = "kernel" if op == "custom-call" else "shapes"
            rows.append(dict(name=name, op=f"fusion({root})" if root else op,
                             shape=re.sub(r"\{[^}]*\}", "", rtype)[:80],
                             source=meta.group(1).split("/")[-1] if meta else "",
                             loop=cname in loops, costing=costing,
                             bytes=float(sum(b for b, _ in parts)),
                             hbm_bytes=float(sum(b for b, t in parts if ON_CHIP not in t))))
    return rows


def costings(rows: list[dict]) -> dict[str, int]:
    """How many ops each costing counted (hlo_op_bytes's `costing`): a plan prints it, so a
    lost cost model (a private jaxlib API) shows as "shapes" instead of passing silently."""
    out: dict[str, int] = {}
    for r in rows:
        out[r["costing"]] = out.get(r["costing"], 0) + 1
    return out


def group_ops(rows: list[dict]) -> list[dict]:
    """hlo_op_bytes' rows grouped by (op, shape, source), heaviest in HBM first."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["op"], r["shape"], r["source"]), dict(
            op=r["op"], shape=r["shape"], source=r["source"], count=0, bytes=0.0, hbm_bytes=0.0))
        g["count"] += 1
        g["bytes"] += r["bytes"]
        g["hbm_bytes"] += r["hbm_bytes"]
    return sorted(groups.values(), key=lambda g: (-g["hbm_bytes"], -g["bytes"]))


def explain(fig: dict, top: int) -> list[str]:
    """The heaviest op groups of a phase's program, as report lines."""
    out = [f"  {'ops':>4s} {'HBM GB':>7s} {'all GB':>7s}  {'op':24s} {'result':42s} source"]
    for g in fig.get("ops", [])[:top]:
        out.append(f"  {g['count']:4d} {g['hbm_bytes'] / 1e9:7.3f} {g['bytes'] / 1e9:7.3f}  "
                   f"{g['op'][:24]:24s} {g['shape'][:42]:42s} {g['source'][:40]}")
    if counted := fig.get("costings"):
        out.append("  costed by: " + ", ".join(f"{k} {v} ops" for k, v in sorted(counted.items()))
                   + ("  (shapes: XLA's cost model was not reached; bytes are operand sizes)"
                      if counted.get("shapes") else ""))
    return out


_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_GROUP = re.compile(r"replica_groups=(?:\{\{([\d,]*)\}|\[\d+,(\d+)\]<=)")
_ARRAY_BYTES = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")


def collectives(hlo_text: str, num_devices: int) -> dict:
    """The collectives between chips in an optimized HLO module (an asynchronous one counted
    at its start) and the bytes each chip sends over ICI for them, ring algorithms over a
    group of n chips: an all-reduce of B bytes 2 (n - 1) / n B, an all-gather to B bytes or
    an all-to-all of B (n - 1) / n B, a reduce-scatter to B bytes (n - 1) B, a
    collective-permute B. A group left unnamed is every device. Returns {"count",
    "result_bytes", "ici_bytes", "by_op": {op: count}}."""
    count, result, ici, by_op = 0, 0, 0.0, {}
    for line in hlo_text.splitlines():
        m = INSTR.match(line)
        if not m or m.group(3).removesuffix("-start") not in _COLLECTIVES:
            continue
        op, rtype = m.group(3).removesuffix("-start"), m.group(2)
        size = max((DTYPE_BYTES[a.group(1)] * math.prod(int(d) for d in a.group(2).split(",") if d)
                    for a in _ARRAY_BYTES.finditer(rtype)), default=0)  # a start's output
        g = _GROUP.search(m.group(4))
        n = (len(g.group(1).split(",")) if g and g.group(1) else int(g.group(2)) if g
             else num_devices)
        share = {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": n - 1,
                 "collective-permute": 1.0}.get(op, (n - 1) / n)
        count, result, ici = count + 1, result + size, ici + share * size
        by_op[op] = by_op.get(op, 0) + 1
    return dict(count=count, result_bytes=result, ici_bytes=ici, by_op=by_op)
