"""Train, evaluate and export an image classifier: the repository's `train.py` command.

    python train.py --data_dir=DATA --model_dir=MODEL [--export_dir=EXPORT]
    python train.py --help

The command is estimator_tpu.cli.train (installed as `estimator-tpu-train`).
"""

from estimator_tpu.cli.train import main

if __name__ == "__main__":
  main()
