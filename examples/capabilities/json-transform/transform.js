// Reads a JSON array of records on stdin and keeps the fields named on the command
// line: `skillbox cap run json-transform --stdin rows.json -- name price`.
// Runs under QuickJS as a WASI guest: no network, no files but /workspace.
import * as std from "qjs:std";

const fields = scriptArgs.slice(1);
if (fields.length === 0) {
  std.err.puts("json-transform: name the fields to keep, e.g. -- name price\n");
  std.exit(2);
}
let rows;
try {
  rows = JSON.parse(std.in.readAsString());
} catch (e) {
  std.err.puts(`json-transform: stdin is not JSON: ${e.message}\n`);
  std.exit(1);
}
if (!Array.isArray(rows)) {
  std.err.puts("json-transform: stdin must be a JSON array of records\n");
  std.exit(1);
}
const kept = rows.map((row) => Object.fromEntries(fields.filter((f) => f in row).map((f) => [f, row[f]])));
const text = JSON.stringify(kept, null, 2) + "\n";
const out = std.open("transformed.json", "w");
out.puts(text);
out.close();
std.out.puts(JSON.stringify(kept) + "\n");
