#!/bin/sh
# Cross-checks the pod-template-hash printer (controllers/deployment/hash.rs) against the real
# go-spew and apimachinery's Quantity: builds a Go program over the 1.32 Go layout and prints, for
# each pod template on stdin (one JSON document a line), its go-spew print and its hash without
# and with collisionCount 1. The golden values of `hashes_match_upstream_compute_hash` come from
# here.
#
#   check_hash.sh API_SRC APIMACHINERY_SRC < templates.jsonl
#
# API_SRC and APIMACHINERY_SRC are checkouts of k8s.io/api and k8s.io/apimachinery at v0.32.0.
# Needs Debian's golang-go, golang-github-davecgh-go-spew-dev and golang-gopkg-inf.v0-dev (GOPATH
# mode, no module downloads).
set -eu
api=$1
machinery=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/src/hashcheck
mkdir -p "$src/resource" "$src/intstr" "$src/main"
python3 "$here/gen_gotypes.py" --go "$src" "$api/core/v1/types.go" "$machinery/pkg/apis/meta/v1/types.go"
# The real Quantity, without its CBOR methods (another package this check does not need).
for f in quantity.go amount.go math.go scale_int.go suffix.go; do
    cp "$machinery/pkg/api/resource/$f" "$src/resource/"
done
python3 - "$src/resource/quantity.go" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read().replace('\tcbor "k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"\n', "")
for sig in ("func (q Quantity) MarshalCBOR", "func (q *Quantity) UnmarshalCBOR"):
    i = s.find(sig)
    if i >= 0:
        s = s[:i] + s[s.find("\n}\n", i) + 3 :]
open(p, "w").write(s)
PY
cat > "$src/intstr/intstr.go" <<'GO'
package intstr

import "encoding/json"

type Type int64

type IntOrString struct {
	Type   Type
	IntVal int32
	StrVal string
}

func (i *IntOrString) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		i.Type = 1
		return json.Unmarshal(b, &i.StrVal)
	}
	i.Type = 0
	return json.Unmarshal(b, &i.IntVal)
}

func (i IntOrString) MarshalJSON() ([]byte, error) {
	if i.Type == 1 {
		return json.Marshal(i.StrVal)
	}
	return json.Marshal(i.IntVal)
}
GO
cat > "$src/main/main.go" <<'GO'
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"

	"github.com/davecgh/go-spew/spew"
	corev1 "hashcheck/core"
)

// apimachinery's dump.ForHash configuration.
var cfg = &spew.ConfigState{Indent: " ", SortKeys: true, DisableMethods: true, SpewKeys: true,
	DisablePointerAddresses: true, DisableCapacities: true}

func safe(s string) string {
	const a = "bcdfghjklmnpqrstvwxz2456789"
	r := make([]byte, len(s))
	for i, b := range []byte(s) {
		r[i] = a[int(b)%len(a)]
	}
	return string(r)
}

func hash(s string, collisions *uint32) string {
	h := fnv.New32a()
	h.Write([]byte(s))
	if collisions != nil {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b, *collisions)
		h.Write(b)
	}
	return safe(fmt.Sprint(h.Sum32()))
}

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var t corev1.PodTemplateSpec
		line := sc.Bytes()
		// As the controller manager sees it after the API server's round trips: empty lists
		// and maps dropped, quantities written with String() and parsed again.
		for i := 0; i < 3; i++ {
			t = corev1.PodTemplateSpec{}
			if err := json.Unmarshal(line, &t); err != nil {
				panic(err)
			}
			line, _ = json.Marshal(t)
		}
		s := cfg.Sprintf("%#v", t)
		one := uint32(1)
		fmt.Printf("%s\n%s %s\n", s, hash(s, nil), hash(s, &one))
	}
}
GO
cd "$src"
GO111MODULE=off GOPATH="$work:/usr/share/gocode" go build -o "$work/hashcheck" ./main
"$work/hashcheck"
