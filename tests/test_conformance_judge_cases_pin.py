"""A case id always denotes the same tensors, from one version of the kit to the next.

``refimpl/conformance/case_types.py`` promises that a case id such as ``"on_boundary/1"`` always
denotes the same inputs: reports, the committed conformance matrix (``docs/conformance-matrix.json``)
and a user's bug report name failing cases by id, and a rerun must meet the same tensors. The class
tests (``test_conformance_judge_cases.py``) check each class's promise (band, bounds, signs, lengths,
groups, partitions); this file pins the rest, the particular values drawn for each id, so that a
changed constant of a generator (an advantage, a filler log-ratio, a seed) is a deliberate change
of the cases, made together with the pins, and never a silent one.

This is a pin of the test *inputs* for stability, not a check of any computed result: the
expected values the kit judges against are computed from these inputs by the reference, never
stored. Per case it holds

- a digest of the exact structure: class, index, shapes, dtypes, row lengths, group ids,
  micro-batches, note, and the position and kind of every non-finite value;
- the position-weighted sum of the finite values of every tensor (``logp``, ``old_logp``,
  ``ref_logp``, ``advantages``, ``rewards``), compared with a relative tolerance of 1e-12 of the
  weighted sum of magnitudes. The values are float64 draws of a seeded ``torch.Generator`` (exact
  everywhere) combined by a few float64 operations whose last bit may depend on the CPU (a row's
  mean, the group statistics, the ``exp`` the exact-tie search uses): each value is within a few
  units in the last place (2.2e-16 relative) of the pinned one on any CPU and thread count, so the
  sums agree to about 1e-15 of the scale; a changed constant moves a sum by at least ~1e-3.

After a deliberate change of the cases, regenerate the pins with
``python -m tests.test_conformance_judge_cases_pin`` (it prints the ``PINS`` literal).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest
import torch

from refimpl.conformance.conventions import Convention
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.losses import PolicyLossVariant, get_preset

# (variant, convention, seed) set-ups that reach every branch of the generators: token level with a
# KL term (references in every case, the kl_penalty class), sequence level with a KL term, a dual
# clip (three bounds), an ungated variant (the default band), the group classes under another
# convention, and a seed other than 0 (each class's generator is seeded 1000 seed + k).
VARIANTS = {
    "dapo_kl": (dataclasses.replace(get_preset("dapo"), kl_coef=0.1), Convention(), 0),
    "gspo_kl": (dataclasses.replace(get_preset("gspo"), kl_coef=0.1), Convention(), 0),
    "ppo_dual": (dataclasses.replace(get_preset("ppo"), dual_clip=3.0), Convention(), 0),
    "none": (PolicyLossVariant(gate="none", eps_low=None, eps_high=None), Convention(), 0),
    "dapo_sample_std": (
        get_preset("dapo"),
        Convention(adv_std="sample", adv_eps=0.01, adv_eps_inside_sqrt=False, adv_zero_variance="formula"),
        0,
    ),
    # GSPO with eps 0.2: the fp16 class's first draw has sequence means away from the bounds but a
    # token within 0.01 of one (a token-level rejection would draw other tensors)
    "gspo_eps_0.2": (dataclasses.replace(get_preset("gspo"), eps_low=0.2, eps_high=0.2), Convention(), 0),
    "dapo_kl_seed_3": (dataclasses.replace(get_preset("dapo"), kl_coef=0.1), Convention(), 3),
}
TENSORS = ("logp", "old_logp", "ref_logp", "advantages", "rewards")
RTOL = 1e-12


def _values(case):
    """(tensor index, flat position, value) of every value of the case's float tensors."""
    for t, name in enumerate(TENSORS):
        x = getattr(case, name)
        if x is not None:
            for k, v in enumerate(x.double().flatten().tolist()):
                yield t, k, v


def structure_digest(case) -> str:
    """The first 16 hex digits of the SHA-256 of the case's exact (non-float) structure."""
    nonfinite = [(t, k, repr(v)) for t, k, v in _values(case) if not math.isfinite(v)]
    parts = (
        case.case_class,
        case.index,
        {name: (tuple(x.shape), str(x.dtype)) for name in TENSORS if (x := getattr(case, name)) is not None},
        case.mask.sum(-1).tolist(),
        bool(torch.equal(case.mask, torch.arange(case.mask.shape[-1]) < case.mask.sum(-1, keepdim=True))),
        case.group_ids.tolist(),
        case.micro_batches,
        case.note,
        nonfinite,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def weighted_sum(case) -> tuple[float, float]:
    """(sum of w v, sum of w |v|) over the finite values v, w = 1 + position + 1000 * tensor index,
    each sum correctly rounded (``math.fsum``; every product w v is rounded once)."""
    terms = [(1 + k + 1000 * t) * v for t, k, v in _values(case) if math.isfinite(v)]
    return math.fsum(terms), math.fsum(abs(x) for x in terms)


def pins_of(variant, convention, seed) -> dict[str, tuple[str, float]]:
    return {
        c.case_id: (structure_digest(c), weighted_sum(c)[0])
        for c in policy_loss_cases(variant, convention, seed=seed)
    }


PINS: dict[str, dict[str, tuple[str, float]]] = {
    "dapo_kl": {
        "inside_clip/0": ("08ba836a07ac7bbb", -115475.38706936287),
        "outside_clip/0": ("7f13075cdbff2cb5", -83791.52926234007),
        "outside_clip/1": ("9be2bc1ff71d1734", -64910.24232414151),
        "on_boundary/0": ("bed7b1066ce9dfcc", 395.3857558420268),
        "on_boundary/1": ("766eb4dac81abd6f", -28183.160467765058),
        "extreme_log_ratio/0": ("12b26cc7071e2e90", -88714.8917417907),
        "extreme_log_ratio/1": ("94645aec4ead3209", -109325.97905974381),
        "ragged/0": ("3a8702b9111cb480", -205374.21232594113),
        "ragged/1": ("e2f62eec7424292a", -174649.14327009182),
        "empty_rows/0": ("4989f6eb8dcffa52", -124894.84310352577),
        "empty_rows/1": ("b2e9c226bd810408", -145450.49191956536),
        "zero_variance_group/0": ("d3834d5d896264dd", -139490.88570324),
        "zero_variance_group/1": ("4c175e9d82ddaacd", -90785.59767455702),
        "singleton_group/0": ("bc2836c3d54abde4", -125420.4056924259),
        "singleton_group/1": ("ac822250b6425fe7", -71732.87070106498),
        "bf16/0": ("af3c68ee91db1dfd", -127455.1619140625),
        "fp16/0": ("6fada57c2a660a18", -110237.14671630859),
        "micro_batch/0": ("9e1a3dd74864fc9e", -159509.9338974002),
        "micro_batch/1": ("aa16238187d47c3a", -143572.8249808465),
        "kl_penalty/0": ("8864d4b385201aff", -75933.67080674827),
        "masked_nonfinite/0": ("b695fcab582abf97", -59713.590071816405),
        "masked_nonfinite/1": ("c8e83bd22f00c473", -59713.590071816405),
        "masked_nonfinite/2": ("62abcafc3e5924e2", -59713.590071816405),
        "masked_nonfinite/3": ("685e11febf8d0886", -63686.340071816405),
        "padding_micro_batch/0": ("049c49a086559b88", -110640.60733097677),
        "padding_micro_batch/1": ("69bfc74baef0f19a", -83381.4370156262),
        "half_overflow/0": ("88fdb76a7a406159", -128733.0380859375),
        "half_overflow/1": ("ae57f2172a9b0a0e", -183914.3046875),
        "half_overflow/2": ("ae45fce59401d5aa", -2549795.18828125),
        "empty_step/0": ("9779952a3c21a078", -19565.100000000002),
        "empty_step/1": ("79dc8fc3ee52cb0b", -17702.1),
        "ratio_overflow/0": ("67b5a295b5cf2da9", -553672.0),
        "ratio_overflow/1": ("e632835419f2a88e", -543616.0),
        "ratio_overflow/2": ("748ce78d4b845de4", -91096.0),
        "zero_rows/0": ("c2c0963eb4b0085b", 0.0),
    },
    "gspo_kl": {
        "inside_clip/0": ("08ba836a07ac7bbb", -101544.28394753377),
        "outside_clip/0": ("7f13075cdbff2cb5", -71010.792237332),
        "outside_clip/1": ("9be2bc1ff71d1734", -75636.49515101741),
        "on_boundary/0": ("b2986977e2a51e3c", -39098.77970870878),
        "on_boundary/1": ("84bf502bc3c386b3", -34246.71849282665),
        "extreme_log_ratio/0": ("12b26cc7071e2e90", -88714.8917417907),
        "extreme_log_ratio/1": ("94645aec4ead3209", -109325.97905974381),
        "ragged/0": ("3a8702b9111cb480", -205359.98271297602),
        "ragged/1": ("e2f62eec7424292a", -174659.01184175545),
        "empty_rows/0": ("4989f6eb8dcffa52", -124897.06735770259),
        "empty_rows/1": ("b2e9c226bd810408", -145450.1166481946),
        "zero_variance_group/0": ("d3834d5d896264dd", -139494.03342645158),
        "zero_variance_group/1": ("4c175e9d82ddaacd", -90790.09595552016),
        "singleton_group/0": ("bc2836c3d54abde4", -125416.37893585126),
        "singleton_group/1": ("ac822250b6425fe7", -71743.23649338224),
        "bf16/0": ("af3c68ee91db1dfd", -127585.4548828125),
        "fp16/0": ("6fada57c2a660a18", -110237.14671630859),
        "micro_batch/0": ("9e1a3dd74864fc9e", -159507.42420065752),
        "micro_batch/1": ("aa16238187d47c3a", -143579.981890507),
        "kl_penalty/0": ("8864d4b385201aff", -75384.05497093046),
        "masked_nonfinite/0": ("b695fcab582abf97", -59717.582756251366),
        "masked_nonfinite/1": ("c8e83bd22f00c473", -59717.582756251366),
        "masked_nonfinite/2": ("62abcafc3e5924e2", -59717.582756251366),
        "masked_nonfinite/3": ("685e11febf8d0886", -63690.332756251366),
        "padding_micro_batch/0": ("049c49a086559b88", -110639.92199148668),
        "padding_micro_batch/1": ("69bfc74baef0f19a", -83377.73536955216),
        "half_overflow/0": ("88fdb76a7a406159", -128733.0380859375),
        "half_overflow/1": ("ae57f2172a9b0a0e", -183914.3046875),
        "half_overflow/2": ("ae45fce59401d5aa", -2549795.18828125),
        "empty_step/0": ("9779952a3c21a078", -19565.100000000002),
        "empty_step/1": ("79dc8fc3ee52cb0b", -17702.1),
        "ratio_overflow/0": ("67b5a295b5cf2da9", -553672.0),
        "ratio_overflow/1": ("e632835419f2a88e", -543616.0),
        "ratio_overflow/2": ("748ce78d4b845de4", -91096.0),
        "zero_rows/0": ("c2c0963eb4b0085b", 0.0),
    },
    "ppo_dual": {
        "inside_clip/0": ("2e938861042d4d28", -33066.50205355924),
        "outside_clip/0": ("cb8bccddf17e95b0", -25787.158661632635),
        "outside_clip/1": ("46b126f3b071f4c5", -10343.268107763794),
        "on_boundary/0": ("85287577a59eade3", 13972.770728739295),
        "on_boundary/1": ("525312e67e9cc52a", -24410.65274703423),
        "extreme_log_ratio/0": ("82bf16ece0057fed", -20782.33672814611),
        "extreme_log_ratio/1": ("e7d652c48a46dd5f", -38111.845955929835),
        "ragged/0": ("678dba1528e028dc", -35764.7739819379),
        "ragged/1": ("08ffb207f0c43867", -41734.63030218708),
        "empty_rows/0": ("d31d2a6b7db96439", -31076.370559512852),
        "empty_rows/1": ("218d82bd72da0363", -23225.51004810495),
        "zero_variance_group/0": ("8e4fd2f62fe06046", -20885.129626170616),
        "zero_variance_group/1": ("ffd82aa692c53d99", -18210.13290371541),
        "singleton_group/0": ("3ca703f567ae9985", -17523.157677251624),
        "singleton_group/1": ("6cfdd7e30ad7df69", -12794.627934377202),
        "bf16/0": ("7747da3f3f849fef", -27503.315234375),
        "fp16/0": ("8cb6016b52ac18a3", -21052.187243652344),
        "micro_batch/0": ("c8ec0ed213f2a69a", -18600.23564723562),
        "micro_batch/1": ("147df505269398c8", -22930.399300180925),
        "masked_nonfinite/0": ("f26b81873f7d1cd7", -20532.40156004748),
        "masked_nonfinite/1": ("62ad7f62bc291444", -20532.40156004748),
        "masked_nonfinite/2": ("73d2d298370ee8ce", -20532.40156004748),
        "padding_micro_batch/0": ("5908f0535fa9b50f", -3221.8843244746995),
        "padding_micro_batch/1": ("23e7c2b1bf49fcf4", -15340.797717404223),
        "half_overflow/0": ("716550612c1a5184", -39872.5625),
        "half_overflow/1": ("f1b18e5b9364323a", -70178.5),
        "half_overflow/2": ("bf60d8ecf9f1968e", -847316.18828125),
        "dual_clip_tie/0": ("da4959f24bc3c431", -12550.131938457489),
        "empty_step/0": ("2b031d0fb9b68ca3", -1547.1000000000013),
        "empty_step/1": ("67fe741900d96db4", 6327.9),
        "ratio_overflow/0": ("b8af2e0fdf8080a2", -597170.875),
        "ratio_overflow/1": ("92605b3f0dafd2e2", -597132.875),
        "ratio_overflow/2": ("a28fa43b620e91e6", -77788.875),
        "zero_rows/0": ("0c4b98d564da7f91", 0.0),
    },
    "none": {
        "inside_clip/0": ("2e938861042d4d28", -33066.52505288631),
        "outside_clip/0": ("cb8bccddf17e95b0", -25788.53038079285),
        "outside_clip/1": ("46b126f3b071f4c5", -10344.639826924007),
        "on_boundary/0": ("9c2f7b473f3b4970", 10782.699383779684),
        "on_boundary/1": ("bc60b4cb79f16d0d", -21985.290583453847),
        "extreme_log_ratio/0": ("82bf16ece0057fed", -20782.33672814611),
        "extreme_log_ratio/1": ("e7d652c48a46dd5f", -38111.845955929835),
        "ragged/0": ("678dba1528e028dc", -35780.59821335928),
        "ragged/1": ("08ffb207f0c43867", -41721.3378599853),
        "empty_rows/0": ("d31d2a6b7db96439", -31072.985799869824),
        "empty_rows/1": ("218d82bd72da0363", -23225.58203424741),
        "zero_variance_group/0": ("8e4fd2f62fe06046", -20879.359249639358),
        "zero_variance_group/1": ("ffd82aa692c53d99", -18203.64923787486),
        "singleton_group/0": ("3ca703f567ae9985", -17527.23948831371),
        "singleton_group/1": ("6cfdd7e30ad7df69", -12780.989078229066),
        "bf16/0": ("7747da3f3f849fef", -27541.4958984375),
        "fp16/0": ("8cb6016b52ac18a3", -21052.187243652344),
        "micro_batch/0": ("c8ec0ed213f2a69a", -18602.351965533966),
        "micro_batch/1": ("147df505269398c8", -22920.820148558054),
        "masked_nonfinite/0": ("f26b81873f7d1cd7", -20526.93457254656),
        "masked_nonfinite/1": ("62ad7f62bc291444", -20526.93457254656),
        "masked_nonfinite/2": ("73d2d298370ee8ce", -20526.93457254656),
        "padding_micro_batch/0": ("5908f0535fa9b50f", -3222.141954895392),
        "padding_micro_batch/1": ("23e7c2b1bf49fcf4", -15345.25270606416),
        "half_overflow/0": ("716550612c1a5184", -39872.5625),
        "half_overflow/1": ("f1b18e5b9364323a", -70178.5),
        "half_overflow/2": ("bf60d8ecf9f1968e", -847316.18828125),
        "empty_step/0": ("2b031d0fb9b68ca3", -1547.1000000000013),
        "empty_step/1": ("67fe741900d96db4", 6327.9),
        "ratio_overflow/0": ("4a5f69cf78db01e1", -503258.375),
        "ratio_overflow/1": ("7da208251126eb4b", -503230.375),
        "ratio_overflow/2": ("6b81edd3abd354f8", -70766.375),
        "zero_rows/0": ("0c4b98d564da7f91", 0.0),
    },
    "dapo_sample_std": {
        "inside_clip/0": ("2e938861042d4d28", -33062.627637553356),
        "outside_clip/0": ("cb8bccddf17e95b0", -25784.512582265994),
        "outside_clip/1": ("46b126f3b071f4c5", -10340.622028397154),
        "on_boundary/0": ("9912276488c7bfe1", 14037.123597076275),
        "on_boundary/1": ("d28868839051da7b", -20715.435222738488),
        "extreme_log_ratio/0": ("82bf16ece0057fed", -20782.33672814611),
        "extreme_log_ratio/1": ("e7d652c48a46dd5f", -38111.845955929835),
        "ragged/0": ("678dba1528e028dc", -35754.35010014435),
        "ragged/1": ("08ffb207f0c43867", -41728.82959823336),
        "empty_rows/0": ("d31d2a6b7db96439", -31072.8775608517),
        "empty_rows/1": ("218d82bd72da0363", -23223.29389701702),
        "zero_variance_group/0": ("8e4fd2f62fe06046", -20874.92006100363),
        "zero_variance_group/1": ("ffd82aa692c53d99", -18205.101366162373),
        "singleton_group/0": ("3ca703f567ae9985", -17518.595836114848),
        "singleton_group/1": ("6cfdd7e30ad7df69", -12790.352412659848),
        "bf16/0": ("7747da3f3f849fef", -27503.315234375),
        "fp16/0": ("8cb6016b52ac18a3", -21052.187243652344),
        "micro_batch/0": ("c8ec0ed213f2a69a", -18594.604930490965),
        "micro_batch/1": ("147df505269398c8", -22926.534417811876),
        "masked_nonfinite/0": ("f26b81873f7d1cd7", -20529.554083399948),
        "masked_nonfinite/1": ("62ad7f62bc291444", -20529.554083399948),
        "masked_nonfinite/2": ("73d2d298370ee8ce", -20529.554083399948),
        "padding_micro_batch/0": ("5908f0535fa9b50f", -3218.5462893375548),
        "padding_micro_batch/1": ("23e7c2b1bf49fcf4", -15339.989015384072),
        "half_overflow/0": ("716550612c1a5184", -39872.5625),
        "half_overflow/1": ("f1b18e5b9364323a", -70178.5),
        "half_overflow/2": ("bf60d8ecf9f1968e", -847316.18828125),
        "empty_step/0": ("2b031d0fb9b68ca3", -1547.1000000000013),
        "empty_step/1": ("67fe741900d96db4", 6327.9),
        "ratio_overflow/0": ("530dcb21b3454878", -491001.875),
        "ratio_overflow/1": ("db7dc8c7341bb324", -490973.875),
        "ratio_overflow/2": ("846b66453fc9f3bc", -58509.875),
        "zero_rows/0": ("0c4b98d564da7f91", 0.0),
    },
    "gspo_eps_0.2": {
        "inside_clip/0": ("2e938861042d4d28", -28393.58743235715),
        "outside_clip/0": ("cb8bccddf17e95b0", -21476.50172527387),
        "outside_clip/1": ("46b126f3b071f4c5", -13945.189741226819),
        "on_boundary/0": ("5f3379fd0df38723", -3528.389589863014),
        "on_boundary/1": ("4c5b9642190847db", -8403.053190638424),
        "extreme_log_ratio/0": ("82bf16ece0057fed", -20782.33672814611),
        "extreme_log_ratio/1": ("e7d652c48a46dd5f", -38111.845955929835),
        "ragged/0": ("678dba1528e028dc", -35764.7739819379),
        "ragged/1": ("08ffb207f0c43867", -41734.63030218708),
        "empty_rows/0": ("d31d2a6b7db96439", -31076.370559512852),
        "empty_rows/1": ("218d82bd72da0363", -23225.51004810495),
        "zero_variance_group/0": ("8e4fd2f62fe06046", -20885.129626170616),
        "zero_variance_group/1": ("ffd82aa692c53d99", -18210.13290371541),
        "singleton_group/0": ("3ca703f567ae9985", -17523.157677251624),
        "singleton_group/1": ("6cfdd7e30ad7df69", -12794.627934377202),
        "bf16/0": ("7747da3f3f849fef", -27541.4958984375),
        "fp16/0": ("8cb6016b52ac18a3", -26953.4626953125),
        "micro_batch/0": ("c8ec0ed213f2a69a", -18600.23564723562),
        "micro_batch/1": ("147df505269398c8", -22930.399300180925),
        "masked_nonfinite/0": ("f26b81873f7d1cd7", -20532.40156004748),
        "masked_nonfinite/1": ("62ad7f62bc291444", -20532.40156004748),
        "masked_nonfinite/2": ("73d2d298370ee8ce", -20532.40156004748),
        "padding_micro_batch/0": ("5908f0535fa9b50f", -3221.8843244746995),
        "padding_micro_batch/1": ("23e7c2b1bf49fcf4", -15340.797717404223),
        "half_overflow/0": ("716550612c1a5184", -39872.5625),
        "half_overflow/1": ("f1b18e5b9364323a", -70178.5),
        "half_overflow/2": ("bf60d8ecf9f1968e", -847316.18828125),
        "empty_step/0": ("2b031d0fb9b68ca3", -1547.1000000000013),
        "empty_step/1": ("67fe741900d96db4", 6327.9),
        "ratio_overflow/0": ("530dcb21b3454878", -491001.875),
        "ratio_overflow/1": ("db7dc8c7341bb324", -490973.875),
        "ratio_overflow/2": ("846b66453fc9f3bc", -58509.875),
        "zero_rows/0": ("0c4b98d564da7f91", 0.0),
    },
    "dapo_kl_seed_3": {
        "inside_clip/0": ("08ba836a07ac7bbb", -91937.25396199936),
        "outside_clip/0": ("7f13075cdbff2cb5", -66940.02813445845),
        "outside_clip/1": ("9be2bc1ff71d1734", -69306.87056788006),
        "on_boundary/0": ("bed7b1066ce9dfcc", -15366.23575293569),
        "on_boundary/1": ("766eb4dac81abd6f", -34230.35054688309),
        "extreme_log_ratio/0": ("12b26cc7071e2e90", -84154.6556706879),
        "extreme_log_ratio/1": ("94645aec4ead3209", -80490.17632243033),
        "ragged/0": ("3a8702b9111cb480", -188968.5904718686),
        "ragged/1": ("e2f62eec7424292a", -146896.98085156287),
        "empty_rows/0": ("4989f6eb8dcffa52", -106653.87366370978),
        "empty_rows/1": ("b2e9c226bd810408", -152793.10729627282),
        "zero_variance_group/0": ("d3834d5d896264dd", -136575.30162229616),
        "zero_variance_group/1": ("4c175e9d82ddaacd", -105973.58387249055),
        "singleton_group/0": ("bc2836c3d54abde4", -144653.54948978816),
        "singleton_group/1": ("ac822250b6425fe7", -82156.87334778595),
        "bf16/0": ("af3c68ee91db1dfd", -135502.991015625),
        "fp16/0": ("6fada57c2a660a18", -125183.50578613281),
        "micro_batch/0": ("9e1a3dd74864fc9e", -176168.90482264705),
        "micro_batch/1": ("aa16238187d47c3a", -149735.70703380104),
        "kl_penalty/0": ("8864d4b385201aff", -87808.81392923497),
        "masked_nonfinite/0": ("b695fcab582abf97", -49327.783377095584),
        "masked_nonfinite/1": ("c8e83bd22f00c473", -49327.783377095584),
        "masked_nonfinite/2": ("62abcafc3e5924e2", -49327.783377095584),
        "masked_nonfinite/3": ("685e11febf8d0886", -53300.533377095584),
        "padding_micro_batch/0": ("049c49a086559b88", -152896.7114786407),
        "padding_micro_batch/1": ("69bfc74baef0f19a", -101660.27527974923),
        "half_overflow/0": ("88fdb76a7a406159", -133585.908203125),
        "half_overflow/1": ("ae57f2172a9b0a0e", -181551.03125),
        "half_overflow/2": ("ae45fce59401d5aa", -2551794.18828125),
        "empty_step/0": ("9779952a3c21a078", -19565.100000000002),
        "empty_step/1": ("79dc8fc3ee52cb0b", -17702.1),
        "ratio_overflow/0": ("67b5a295b5cf2da9", -553672.0),
        "ratio_overflow/1": ("e632835419f2a88e", -543616.0),
        "ratio_overflow/2": ("748ce78d4b845de4", -91096.0),
        "zero_rows/0": ("c2c0963eb4b0085b", 0.0),
    },
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_case_id_denotes_the_pinned_tensors(name):
    """Kills the generators' case-data mutants (a constant changed to another that keeps every
    promise of its class: ``_inside`` mutmut_17, ``_extreme`` mutmut_25, ``policy_loss_cases``
    mutmut_1 (the default seed), ...), formerly listed as equivalent."""
    variant, convention, seed = VARIANTS[name]
    cases = {c.case_id: c for c in policy_loss_cases(variant, convention, seed=seed)}
    assert list(cases) == list(PINS[name])
    for case_id, (digest, pinned) in PINS[name].items():
        case = cases[case_id]
        assert structure_digest(case) == digest, case_id
        total, scale = weighted_sum(case)
        assert abs(total - pinned) <= RTOL * scale, (case_id, total, pinned)


if __name__ == "__main__":  # print the PINS literal (after a deliberate change of the cases)
    print("PINS: dict[str, dict[str, tuple[str, float]]] = {")
    for name, (variant, convention, seed) in VARIANTS.items():
        print(f'    "{name}": {{')
        for case_id, (digest, total) in pins_of(variant, convention, seed).items():
            print(f'        "{case_id}": ("{digest}", {total!r}),')
        print("    },")
    print("}")
