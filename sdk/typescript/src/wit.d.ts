// The hub's imports as componentize-js binds them (WIT `hub:plugin/host`):
// s64 arrives as bigint, `option` as undefined, `result` errors are thrown.
declare module "hub:plugin/host@0.1.0" {
  export type WitLevel = "trace" | "debug" | "info" | "warn" | "error";
  export function log(level: WitLevel, message: string): void;
  export function config(): string;
  export function kvGet(key: string): string | undefined;
  export function kvSet(key: string, value: string): void;
  export function kvDelete(key: string): void;
  export function send(destination: string, payload: string): { status: number; body: string };
}
