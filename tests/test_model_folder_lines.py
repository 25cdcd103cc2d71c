"""A model folder's JSONL files are read back whole whatever text a model sampled: JSON leaves
U+2028, U+2029 and U+0085 unescaped, and ``str.splitlines()`` cut a record there (seen: a
tiny-random completion holding one made ``read_trajectories`` fail in the pipeline's test)."""

from __future__ import annotations

from pathlib import Path

import art_core as art
from art_core.model_folder import ModelFolder

SEPARATORS = "line\u2028para\u2029next\x85end\x0bvt\x1cfs"


def test_sampled_text_with_unicode_line_separators_reads_back_whole(tmp_path: Path) -> None:
    folder = ModelFolder(tmp_path / "model")
    group = art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[
                    {"role": "user", "content": "say something"},
                    {"role": "assistant", "content": SEPARATORS},
                ],
                reward=r,
                metadata={"note": SEPARATORS},
            )
            for r in (0.0, 1.0)
        ]
    )
    folder.append_trajectories("train", 0, [group.model_dump_json(), group.model_dump_json()])
    folder.append_history({"step": 0, "split": "train", "note": SEPARATORS})
    groups = folder.read_trajectories("train", 0)
    assert len(groups) == 2
    assert groups[0].trajectories[1].messages()[-1]["content"] == SEPARATORS
    assert groups[1].trajectories[0].metadata["note"] == SEPARATORS
    [record] = folder.read_history()
    assert record["note"] == SEPARATORS
