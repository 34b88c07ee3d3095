"""The cluster providers (``controllers.provider.ClusterProvider``): one module each."""
