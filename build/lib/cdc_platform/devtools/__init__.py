"""Dev-only code, apart from the product: the local stack, the demo databases and
workloads, fault injection, the daemon stand-in the fault suite drives, screenshots."""
