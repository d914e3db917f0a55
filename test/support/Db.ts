import * as Crypto from "node:crypto"
import pg from "pg"
import { POSTGRES } from "./Services.js"

const admin = async <A>(f: (client: pg.Client) => Promise<A>): Promise<A> => {
  const client = new pg.Client({ ...POSTGRES })
  await client.connect()
  try {
    return await f(client)
  } finally {
    await client.end()
  }
}

export interface FreshDatabase {
  readonly name: string
  readonly url: string
  readonly drop: () => Promise<void>
}

/** A new, empty database on the local PostgreSQL, so runs never see each other's data. */
export const freshDatabase = async (label = "t"): Promise<FreshDatabase> => {
  const name = `ws_${label}_${Date.now().toString(36)}_${Crypto.randomBytes(3).toString("hex")}`
  await admin((c) => c.query(`CREATE DATABASE ${name}`))
  return {
    name,
    url: `postgres://${POSTGRES.user}@${POSTGRES.host}:${POSTGRES.port}/${name}`,
    drop: () => admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(() => undefined)
  }
}
