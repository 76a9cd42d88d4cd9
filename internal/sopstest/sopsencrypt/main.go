// Command sopsencrypt encrypts YAML files in place the way
// `sops encrypt --age <recipient> --encrypted-regex '^(data|stringData)$' -i`
// does, with the sops library, for the recipients of an age key file. It
// exists for the examples (go generate ./examples/): this repository has
// no sops binary, and an operator uses sops itself (docs/secrets.md). A
// file that is encrypted already is left as it is, so running it twice
// changes nothing.
//
//	go run ./internal/sopstest/sopsencrypt -key examples/DEMO-KEY-NOT-SECRET.agekey FILE...
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"

	"filippo.io/age"

	"github.com/capstan-dev/capstan/internal/sopstest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sopsencrypt:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sopsencrypt", flag.ContinueOnError)
	keyFile := fs.String("key", "", "age identity file (age-keygen's keys.txt): the files are encrypted for its public keys")
	regex := fs.String("encrypted-regex", sopstest.SecretDataRegex, "encrypt the values of the keys matching this regular expression")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keyFile == "" || fs.NArg() == 0 {
		return errors.New("usage: sopsencrypt -key FILE.agekey FILE.yaml...")
	}
	raw, err := os.ReadFile(*keyFile)
	if err != nil {
		return err
	}
	// age's parser skips the # lines; its errors do not quote the key.
	ids, err := age.ParseIdentities(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%s: %w", *keyFile, err)
	}
	var to []sopstest.Recipient
	for _, id := range ids {
		x, ok := id.(*age.X25519Identity)
		if !ok {
			return fmt.Errorf("%s: only X25519 identities (AGE-SECRET-KEY-1...) are supported", *keyFile)
		}
		to = append(to, sopstest.Age(x))
	}
	for _, file := range fs.Args() {
		plain, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if sopstest.IsEncrypted(plain) {
			fmt.Printf("%s: encrypted already, left as it is\n", file)
			continue
		}
		out, err := sopstest.Encrypt(sopstest.FormatYAML, plain, *regex, to...)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if err := os.WriteFile(file, out, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: encrypted for %d recipient(s)\n", file, len(to))
	}
	return nil
}
