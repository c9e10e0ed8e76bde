"""Which targets planning stops timing: slow on every layer so far, and seconds spent on it."""

from __future__ import annotations

from edgepilot.dispatch.measuring.crawl import CRAWL_LAYERS, Crawlers


def test_a_per_call_cost_on_small_layers_is_no_crawl() -> None:
    # an NPU delegate paying 5 ms a call where the CPU takes 0.1 ms: 50x on the small layers,
    # but 15 ms spent: timed on, so the big layers it may win are measured
    crawl = Crawlers("ref")
    for _ in range(CRAWL_LAYERS + 2):
        crawl.saw({"ref": 0.2, "cpu": 0.1, "npu": 5.0})
    assert crawl.reason("npu") == ""


def test_seconds_a_layer_on_every_layer_is_a_crawl_and_one_fast_layer_clears_it() -> None:
    crawl = Crawlers("ref")
    crawl.saw({"ref": 3.0, "cpuref": 1400.0, "late": 1400.0})
    crawl.saw({"ref": 2.0, "cpuref": 1300.0, "late": 1.0})  # "late" wins this one
    assert crawl.reason("cpuref") == ""  # two layers: not yet
    crawl.saw({"ref": 2.0, "cpuref": 900.0, "late": 1500.0})
    assert "3 layers it ran first (3.6 s for those)" in crawl.reason("cpuref")
    assert crawl.reason("late") == ""
    # the reference is never dropped, however slow: every reference value comes from it
    slow_ref = Crawlers("ref")
    for _ in range(5):
        slow_ref.saw({"ref": 1000.0, "fast": 1.0})
    assert slow_ref.reason("ref") == ""
    # a layer no target ran says nothing
    slow_ref.saw({"ref": None, "fast": None})


def test_seconds_a_call_on_one_layer_is_a_crawl_at_once() -> None:
    """A 32 KB face detector on a 1280x960 input: Arm NN's reference kernels took 2.9-4.1 s a
    layer, and the three layers they ran before being dropped were 21 s of a 44 s plan."""
    crawl = Crawlers("ref")
    crawl.saw({"ref": 12.0, "xnnpack": 6.0, "cpuref": 2900.0, "npu": 40.0})
    assert "2.9 s a call on a layer it ran first" in crawl.reason("cpuref")
    assert crawl.reason("npu") == ""  # 7x the fastest: timed on
