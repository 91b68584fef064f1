"""Model builders for the engines (transformers models from our `ModelConfig`)."""
