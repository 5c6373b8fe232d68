// A garden origin on Node's http (llhttp): answers every request with one line naming what
// its parser read (method, target, body length) and prints the same line.
//
//   node origin.js PORT
const http = require("http");
const server = http.createServer((request, response) => {
  let length = 0;
  request.on("data", (chunk) => { length += chunk.length; });
  request.on("end", () => {
    const line = `${request.method} ${request.url} ${length}\n`;
    process.stdout.write(line);
    response.writeHead(200, { "Content-Length": Buffer.byteLength(line) });
    response.end(line);
  });
  request.on("error", () => {});
});
server.keepAliveTimeout = 60000;
server.listen(Number(process.argv[2]), "127.0.0.1");
