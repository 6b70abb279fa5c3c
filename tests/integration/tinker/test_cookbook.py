"""tinker-cookbook's ``sl_basic`` recipe, as installed (0.1.0), fine-tunes the tiny model through the service:
only its base URL, model name, dataset (its documented ``FromConversationFileBuilder`` swap, on a JSONL file
of conversations written here) and step sizes are set, on its command line. Its own metrics log shows the
training NLL falling, and its final checkpoint is this service's saved state and sampler weights."""

import json
import math
import subprocess
import sys
import time

CONVERSATIONS = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                               {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}
                 for a in range(4) for b in range(4)]


def test_sl_basic_recipe_trains_through_the_service(service, tmp_path):
    data, log, model = tmp_path / "conversations.jsonl", tmp_path / "sl_basic", str(service.model)
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    args = [f"base_url={service.url}", f"model_name={model}", f"log_path={log}", "learning_rate=3e-3", "num_epochs=3",
            "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
            f"dataset_builder.file_path={data}", f"dataset_builder.common_config.model_name_for_tokenizer={model}",
            "dataset_builder.common_config.renderer_name=role_colon",
            "dataset_builder.common_config.max_length=64", "dataset_builder.common_config.batch_size=8"]
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "tinker_cookbook.recipes.sl_basic", *args],
                         capture_output=True, text=True, timeout=300)
    (tmp_path / "sl_basic.out").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    print(f"sl_basic: {len(nll)} steps in {time.monotonic() - start:.0f} s, train_mean_nll "
          + " ".join(f"{x:.3f}" for x in nll))
    assert [r["step"] for r in rows] == list(range(6))  # 16 conversations, batches of 8, 3 epochs
    assert all(math.isfinite(x) for x in nll) and nll[-1] < 0.65 * nll[0], nll
    final = json.loads((log / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["name"] == "final"
    assert final["state_path"].startswith("tinker://") and final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")
