// Command hello is the tiny static program the image tests pack: it prints
// its stamped version, platform and user, so a test that runs it from the
// unpacked layer sees the ldflags took effect.
package main

import (
	"fmt"
	"os"
	"runtime"
)

// version is stamped by the test: -ldflags "-X main.version=...".
var version = "unset"

func main() {
	fmt.Printf("hello %s %s/%s uid=%d\n", version, runtime.GOOS, runtime.GOARCH, os.Getuid())
}
