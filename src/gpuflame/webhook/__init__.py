"""The Kubernetes mutating admission webhook: inject gpuflame into annotated pods."""
