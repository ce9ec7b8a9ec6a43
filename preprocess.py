"""Turn labelled images into TFRecord shards with Apache Beam: the repository's `preprocess.py`.

    python preprocess.py --input_dir=IMAGES --output_dir=DATA [Beam options]
    python preprocess.py --help

The command is estimator_tpu.cli.preprocess (installed as `estimator-tpu-preprocess`).
"""

from estimator_tpu.cli.preprocess import main

if __name__ == "__main__":
  main()
