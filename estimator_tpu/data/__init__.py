"""The data: record schema, on-disk dataset layout, image ops, the input_fn, bundled digits."""
