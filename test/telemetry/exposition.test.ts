/** The strict exposition reader used by the metrics tests refuses what Prometheus refuses. */
import { describe, expect, it } from "vitest"
import { histograms, parseExposition } from "../support/Exposition.js"

/** The example of the Prometheus documentation ("Exposition formats", text format example), lightly trimmed. */
const DOC_EXAMPLE = `# HELP http_requests_total The total number of HTTP requests.
# TYPE http_requests_total counter
http_requests_total{method="post",code="200"} 1027 1395066363000
http_requests_total{method="post",code="400"}    3 1395066363000

# Escaping in label values:
msdos_file_access_time_seconds{path="C:\\\\DIR\\\\FILE.TXT",error="Cannot find file:\\n\\"FILE.TXT\\""} 1.458255915e9

# Minimalistic line:
metric_without_timestamp_and_labels 12.47

# A weird metric from before the epoch:
something_weird{problem="division by zero"} +Inf -3982045

# A histogram, which has a pretty complex representation in the text format:
# HELP http_request_duration_seconds A histogram of the request duration.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{le="0.05"} 24054
http_request_duration_seconds_bucket{le="0.1"} 33444
http_request_duration_seconds_bucket{le="0.2"} 100392
http_request_duration_seconds_bucket{le="0.5"} 129389
http_request_duration_seconds_bucket{le="1"} 133988
http_request_duration_seconds_bucket{le="+Inf"} 144320
http_request_duration_seconds_sum 53423
http_request_duration_seconds_count 144320
`

describe("strict exposition reader", () => {
  it("reads the documentation's example", () => {
    const families = parseExposition(DOC_EXAMPLE)
    expect(families.get("http_requests_total")!.samples.map((s) => s.value)).toEqual([1027, 3])
    expect(families.get("msdos_file_access_time_seconds")!.samples[0]!.labels).toEqual({
      path: "C:\\DIR\\FILE.TXT",
      error: "Cannot find file:\n\"FILE.TXT\""
    })
    expect(families.get("something_weird")!.samples[0]!.value).toBe(Infinity)
    const [h] = histograms(families.get("http_request_duration_seconds")!)
    expect([h!.count, h!.sum, h!.buckets.length]).toEqual([144320, 53423, 6])
  })

  it.each([
    ["no final newline", "a 1"],
    ["bad metric name", "1a 1\n"],
    ["bad label name", "a{1x=\"v\"} 1\n"],
    ["reserved label name", "a{__x=\"v\"} 1\n"],
    ["unknown escape", "a{x=\"\\t\"} 1\n"],
    ["unterminated label value", "a{x=\"v} 1\n"],
    ["value missing", "a{x=\"v\"}\n"],
    ["value not a float", "a 1,5\n"],
    ["duplicate series", "a{x=\"1\"} 1\na{x=\"1\"} 2\n"],
    ["duplicate label", "a{x=\"1\",x=\"2\"} 1\n"],
    ["family split", "a 1\nb 1\na{x=\"1\"} 1\n"],
    ["type after samples", "a 1\n# TYPE a counter\n"],
    ["second type", "# TYPE a counter\n# TYPE a gauge\na 1\n"],
    ["negative counter", "# TYPE a counter\na -1\n"],
    ["bucket without le", "# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n"],
    ["no +Inf bucket", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"],
    ["+Inf is not count", "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n"],
    ["decreasing buckets", "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"],
    ["missing sum", "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n"]
  ])("refuses %s", (_, text) => {
    expect(() => parseExposition(text)).toThrow()
  })
})
