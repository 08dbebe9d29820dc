"""The models: the networks a run trains, and a checkpoint's network packaged for serving."""
