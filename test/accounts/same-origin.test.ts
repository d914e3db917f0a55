/** The pure rules of SameOrigin.ts; the HTTP behaviour is in csrf.test.ts. */
import { describe, expect, it } from "vitest"
import {
  allowedOrigins,
  cookieRequestRefusal,
  isJsonContentType,
  normalizeOrigin,
  ownOrigins
} from "../../src/accounts/SameOrigin.js"

const none = new Set<string>()

describe("normalizeOrigin", () => {
  it("keeps scheme, host and a non-default port, lower-cased", () => {
    expect(normalizeOrigin("HTTPS://Dash.Example.COM")).toBe("https://dash.example.com")
    expect(normalizeOrigin("https://dash.example.com:443")).toBe("https://dash.example.com")
    expect(normalizeOrigin("http://127.0.0.1:8080")).toBe("http://127.0.0.1:8080")
  })
  it("refuses what is not an http(s) origin", () => {
    for (const raw of ["null", "", "file://x", "https://a.example/path", "https://a.example/", "https://u:p@a.example", "https://a.example?x=1", "javascript:alert(1)"]) {
      expect(normalizeOrigin(raw)).toBeNull()
    }
  })
})

describe("ownOrigins", () => {
  it("is http:// plus the Host header, and the forwarded scheme and host when present", () => {
    expect([...ownOrigins({ host: "127.0.0.1:8080" })]).toEqual(["http://127.0.0.1:8080"])
    expect(new Set(ownOrigins({ host: "10.0.0.5:8080", "x-forwarded-host": "gw.example, proxy.internal", "x-forwarded-proto": "https, http" })))
      .toEqual(new Set(["http://10.0.0.5:8080", "https://10.0.0.5:8080", "http://gw.example", "https://gw.example"]))
  })
  it("ignores host values that are not host names and unknown schemes", () => {
    expect([...ownOrigins({ host: "evil.example/@x", "x-forwarded-proto": "ftp" })]).toEqual([])
  })
})

describe("cookieRequestRefusal", () => {
  const json = { "content-type": "application/json", host: "gw.example" }
  it("lets every read through", () => {
    for (const method of ["GET", "HEAD", "OPTIONS"]) {
      expect(cookieRequestRefusal(method, { origin: "https://evil.example", "sec-fetch-site": "cross-site" }, none)).toBeNull()
    }
  })
  it("judges the origin before the content type", () => {
    expect(cookieRequestRefusal("POST", { origin: "https://evil.example", "content-type": "text/plain" }, none)).toBe("cross_site_request")
    expect(cookieRequestRefusal("POST", { origin: "http://gw.example", host: "gw.example", "content-type": "text/plain" }, none))
      .toBe("unsupported_content_type")
  })
  it("accepts same-origin or none Sec-Fetch-Site, the request's own Origin, or a dashboard origin", () => {
    expect(cookieRequestRefusal("POST", { ...json, "sec-fetch-site": "same-origin" }, none)).toBeNull()
    expect(cookieRequestRefusal("PATCH", { ...json, "sec-fetch-site": "none" }, none)).toBeNull()
    expect(cookieRequestRefusal("PUT", { ...json, origin: "http://gw.example" }, none)).toBeNull()
    const dash = allowedOrigins(["https://Dash.example.com", "https://bad.example/path"])
    expect([...dash]).toEqual(["https://dash.example.com"])
    expect(cookieRequestRefusal("POST", { ...json, origin: "https://dash.example.com", "sec-fetch-site": "cross-site" }, dash)).toBeNull()
  })
  it("refuses a mutation with neither header, a null Origin, or another site", () => {
    for (const extra of [{}, { origin: "null" }, { "sec-fetch-site": "same-site" }, { origin: "https://gw.example" }]) {
      expect(cookieRequestRefusal("POST", { ...json, ...extra }, none)).toBe("cross_site_request")
    }
    expect(cookieRequestRefusal("DELETE", { host: "gw.example" }, none)).toBe("cross_site_request")
  })
  it("DELETE needs no content type; POST, PUT and PATCH need JSON", () => {
    expect(cookieRequestRefusal("DELETE", { origin: "http://gw.example", host: "gw.example" }, none)).toBeNull()
    for (const method of ["POST", "PUT", "PATCH"]) {
      expect(cookieRequestRefusal(method, { origin: "http://gw.example", host: "gw.example" }, none)).toBe("unsupported_content_type")
    }
  })
})

describe("isJsonContentType", () => {
  it("is application/json with any parameters, nothing else", () => {
    expect(isJsonContentType("application/json")).toBe(true)
    expect(isJsonContentType("Application/JSON; charset=UTF-8")).toBe(true)
    for (const type of [undefined, "", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/json-patch+json", "text/json"]) {
      expect(isJsonContentType(type)).toBe(false)
    }
  })
})
