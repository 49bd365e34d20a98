//! A fake Kubernetes API server (being written).
