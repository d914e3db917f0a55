// The entry point: fix the heap configuration first (it may restart the process in place), then load the gateway.
import { applyHeapBound } from "./runtime/HeapBound.js"

applyHeapBound()
await import("./Gateway.js")
