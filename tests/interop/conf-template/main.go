// Renders a containerd CNI conf_template the way containerd's CRI plugin does when
// kubelet reports the node's pod CIDRs (UpdateRuntimeConfig): Go's text/template with
// the fields PodCIDR (the first CIDR), PodCIDRRanges (all of them) and Routes (a default
// route per address family present).
//
//	conf-template TEMPLATE CIDR...
//
// prints the rendered config on stdout. Used by tests/tests/conf_template.rs.
package main

import (
	"fmt"
	"net"
	"os"
	"text/template"
)

type templateData struct {
	PodCIDR       string
	PodCIDRRanges []string
	Routes        []string
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: conf-template TEMPLATE CIDR...")
		os.Exit(2)
	}
	cidrs := os.Args[2:]
	data := templateData{PodCIDR: cidrs[0], PodCIDRRanges: cidrs}
	var v4, v6 bool
	for _, cidr := range cidrs {
		ip, _, err := net.ParseCIDR(cidr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad CIDR %q: %v\n", cidr, err)
			os.Exit(2)
		}
		if ip.To4() != nil {
			if !v4 {
				data.Routes = append(data.Routes, "0.0.0.0/0")
			}
			v4 = true
		} else {
			if !v6 {
				data.Routes = append(data.Routes, "::/0")
			}
			v6 = true
		}
	}
	tmpl, err := template.ParseFiles(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := tmpl.Execute(os.Stdout, data); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
