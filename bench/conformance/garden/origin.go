// A garden origin on Go's net/http: answers every request with one line naming what its
// parser read (method, target, body length) and prints the same line, so the garden can
// compare what the origin read with what the proxy in front of it forwarded.
//
//	go run origin.go 127.0.0.1:PORT
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
)

func main() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		length := strconv.Itoa(len(body))
		if err != nil {
			length = "bad-body"
		}
		line := fmt.Sprintf("%s %s %s\n", r.Method, r.RequestURI, length)
		os.Stdout.WriteString(line)
		w.Header().Set("Content-Length", strconv.Itoa(len(line)))
		w.Write([]byte(line))
	})
	if err := http.ListenAndServe(os.Args[1], handler); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
