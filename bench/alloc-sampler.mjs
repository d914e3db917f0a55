// Preloaded into the gateway by bench/counts.sh (`node --import`): the first SIGUSR2 starts V8's sampling heap
// profiler on the main thread (objects collected since counted too, so it sees what a request allocates, not only
// what survives), the second writes the profile to $ALLOC_PROFILE and stops it. Bench use only.
import { writeFileSync } from "node:fs"
import { Session } from "node:inspector"

const session = new Session()
session.connect()
const post = (method, params) =>
  new Promise((resolve, reject) => session.post(method, params, (error, result) => (error ? reject(error) : resolve(result))))
let sampling = false
process.on("SIGUSR2", async () => {
  if (!sampling) {
    sampling = true
    await post("HeapProfiler.enable")
    await post("HeapProfiler.startSampling", {
      samplingInterval: Number(process.env.ALLOC_INTERVAL ?? 4096),
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true
    })
  } else {
    const { profile } = await post("HeapProfiler.stopSampling")
    writeFileSync(process.env.ALLOC_PROFILE, JSON.stringify(profile))
    sampling = false
  }
})
