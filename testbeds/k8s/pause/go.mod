module mpilaunch.local/pause

go 1.23.0
