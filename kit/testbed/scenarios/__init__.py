"""Sites and stories composed of components: what a test tier, a demo or a benchmark runs."""
