// Command vtcombo_auth is Vitess's vtcombo plus the static-file MySQL authentication that
// the standalone vtgate has and vtcombo lacks.
//
// vttestserver is the quickest real Vitess we can run on one machine, but its vtgate accepts
// any MySQL user. Our users' vtgates check passwords, so the one our tests talk to must as
// well: this binary is started in vtcombo's place (see dev/local_vitess.sh).
package main

import (
	"vitess.io/vitess/go/cmd/vtcombo/cli"
	"vitess.io/vitess/go/exit"
	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/vt/log"
	"vitess.io/vitess/go/vt/utils"
	"vitess.io/vitess/go/vt/vtgate"
)

func main() {
	defer exit.Recover()

	var usersFile string
	cli.Main.Flags().StringVar(&usersFile, "mysql-auth-server-static-file", "",
		"JSON file of MySQL users and passwords accepted by vtgate's MySQL listener.")
	// vtgate runs its plugin initializers once its MySQL listener is configured, after flags
	// are parsed, so the file name is known by then.
	vtgate.RegisterPluginInitializer(func() {
		mysql.InitAuthServerStatic(usersFile, "", 0)
	})

	cli.Main.SetGlobalNormalizationFunc(utils.NormalizeUnderscoresToDashes)
	if err := cli.Main.Execute(); err != nil {
		log.Error(err)
		exit.Return(1)
	}
}
