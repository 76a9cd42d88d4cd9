package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t := time.Now()
	e, err := testenv.Start(ctx, testenv.Options{BinDir: "/root/.cache/capstan/testbin/v1.35.4", Progress: os.Stderr, CRDDirs: []string{"internal/testenv/testdata/crds"}, Dir: "/tmp/scratch-env"})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("started in", time.Since(t), e.KubeconfigPath)
	ns, err := e.CreateNamespace(ctx, "Scratch/Test")
	fmt.Println(ns, err)
	t = time.Now()
	fmt.Println("stop:", e.Stop(), time.Since(t))
}
