"""Loop checkpoints are atomic: an interrupted save leaves the previous one as the latest."""

import pytest

from megatron_rl.checkpoint import latest_checkpoint, save_checkpoint


def write(tag):
    def fn(path):
        path.mkdir()
        (path / "weights.txt").write_text(tag)
    return fn


def test_save_then_resume_reads_the_newest(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 1, write("one"), {"step": 1}, keep=2)
    save_checkpoint(tmp_path, 2, write("two"), {"step": 2, "data": {"index": 8}}, keep=2)
    path, state = latest_checkpoint(tmp_path)
    assert state == {"step": 2, "data": {"index": 8}}
    assert (path / "trainer" / "weights.txt").read_text() == "two"


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, write("one"), {"step": 1}, keep=2)

    def crash(path):
        path.mkdir()
        raise KeyboardInterrupt  # the process dies while the trainer writes

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, crash, {"step": 2}, keep=2)
    path, state = latest_checkpoint(tmp_path)
    assert state["step"] == 1 and (path / "trainer" / "weights.txt").read_text() == "one"
    save_checkpoint(tmp_path, 2, write("two"), {"step": 2}, keep=2)
    assert not list(tmp_path.glob("*.tmp"))


def test_only_the_newest_are_kept(tmp_path):
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, write(str(step)), {"step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_3", "step_4"]
