"""TF Serving deployment of an exported model, from the repository: estimator_tpu.serving.

    python -m serving.predict --saved_model=EXPORT --input='photos/*.jpg' --output=preds.csv
    python -m serving.client --server=localhost:8501 photo.jpg

The code and TF Serving's config files (models.config, batching_parameters.txt)
live in the installed package, estimator_tpu.serving; README.md here says how
to run TF Serving with them.
"""

from estimator_tpu.serving import *  # noqa: F403 -- the same names, for `import serving`
