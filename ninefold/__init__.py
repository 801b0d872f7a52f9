"""ninefold: where every nanosecond of every GPU of a training job went."""
