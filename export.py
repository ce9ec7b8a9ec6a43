"""Export a trained model dir as a SavedModel for TF Serving: the repository's `export.py` command.

    python export.py --model_dir=MODEL --export_dir=EXPORT
    python export.py --help

The command is estimator_tpu.cli.export (installed as `estimator-tpu-export`).
"""

from estimator_tpu.cli.export import main

if __name__ == "__main__":
  main()
