"""The Apache Beam preprocessing job: options, input sources, split/shard plan, pipeline."""
