"""Gavel's measured throughputs: training steps per second of each job type, alone on one GPU.

Source: ``scheduler/oracle_throughputs_v3.json`` of stanford-futuredata/gavel (commit
``e0d104a8c09983c49c5152ba3f044f9ee49960dc``; MIT licence, © 2020 Stanford Future Data
Systems), the ``"null"`` entry (the job running alone, not co-located) of each
``('<job type>', 1)`` key, under ``v100``, ``p100_unconsolidated`` and ``k80``. The file the
paper's simulations name, ``simulation_throughputs.json``, has the same layout; it was not
at hand, so these are the oracle measurements that preceded it. Values are copied as
published; 0.0 means the job does not fit on that GPU (ResNet-50 with batch size 128 on a
K80).

Only scale factor 1 is here: ``sim.traces.gavel`` derives multi-GPU jobs from it (see
there). Add ``(job type, scale factor)`` rows to :data:`STEPS_PER_SECOND` to replay those
exactly.
"""

from __future__ import annotations

MODELS = ("V100", "P100", "K80")

# (job type, scale factor) → steps per second on (V100, P100, K80).
STEPS_PER_SECOND: dict[tuple[str, int], tuple[float, float, float]] = {
    ("ResNet-18 (batch size 16)", 1): (32.353384328946916, 35.869203207990005, 4.907044539018749),
    ("ResNet-18 (batch size 32)", 1): (29.947157347732464, 35.82535355155143, 7.878567065381904),
    ("ResNet-18 (batch size 64)", 1): (24.093231895382736, 22.30494387033663, 7.23126031032182),
    ("ResNet-18 (batch size 128)", 1): (22.37157036353171, 11.675499943575447, 1.9043012927106093),
    ("ResNet-18 (batch size 256)", 1): (11.949277372202666, 7.72278472419796, 0.9407005064508588),
    ("ResNet-50 (batch size 16)", 1): (12.21691492060599, 9.052989674171888, 2.5174034014649562),
    ("ResNet-50 (batch size 32)", 1): (7.930372537553422, 4.888323684976709, 1.4232621404865116),
    ("ResNet-50 (batch size 64)", 1): (4.525762041224065, 2.6194694075770055, 0.7458616001066279),
    ("ResNet-50 (batch size 128)", 1): (2.5301133768088104, 1.5843515911819712, 0.0),
    ("Transformer (batch size 16)", 1): (11.06408721300405, 9.537249191611776, 5.545041265731713),
    ("Transformer (batch size 32)", 1): (9.682863271706568, 7.8692234803005805, 3.6572135443704648),
    ("Transformer (batch size 64)", 1): (8.209555577759708, 5.091830907900463, 1.973317477882473),
    ("Transformer (batch size 128)", 1): (
        5.642201972497628,
        3.0735350560514787,
        1.0286729325855941,
    ),
    ("Transformer (batch size 256)", 1): (
        1.5951407072133263,
        1.6776964927127545,
        0.4932247600901891,
    ),
    ("LM (batch size 5)", 1): (114.11092944480009, 90.77591199634988, 26.101178154883158),
    ("LM (batch size 10)", 1): (81.65163491883021, 77.0846780814848, 24.737547489916363),
    ("LM (batch size 20)", 1): (64.74245099960703, 58.17267240669826, 17.647422054723275),
    ("LM (batch size 40)", 1): (50.04898767272388, 35.76638325549232, 12.0392451472542),
    ("LM (batch size 80)", 1): (31.6895965843242, 21.157527655800312, 6.643066870878164),
    ("Recommendation (batch size 512)", 1): (
        253.62997501442302,
        48.882390510045944,
        58.75129064637712,
    ),
    ("Recommendation (batch size 1024)", 1): (
        150.53937584057948,
        30.74443726150114,
        34.79400981880749,
    ),
    ("Recommendation (batch size 2048)", 1): (
        88.20699311038362,
        16.59663998583255,
        18.92559794857559,
    ),
    ("Recommendation (batch size 4096)", 1): (
        45.84989816146732,
        8.896661974093526,
        8.339825530943594,
    ),
    ("Recommendation (batch size 8192)", 1): (
        22.24682308518159,
        5.548440840558535,
        3.9642048992776715,
    ),
    ("A3C", 1): (7.479619707470718, 5.681346110543853, 3.5357143756878346),
    ("CycleGAN", 1): (4.735589112139888, 2.4026681703106223, 0.546895777657124),
}
