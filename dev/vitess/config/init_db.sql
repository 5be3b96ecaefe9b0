-- First-boot SQL for the MariaDB instance behind our local vttestserver.
--
-- Vitess ships an init file written for MySQL 8 (it toggles super_read_only,
-- which MariaDB does not have, and grants PROXY). This one creates the same
-- accounts with statements MariaDB 10.11 accepts. It runs once, while mysqld
-- is being initialised, with binary logging off so the accounts never reach
-- a VStream.
SET sql_log_bin = 0;

DROP USER IF EXISTS ''@'%', ''@'localhost', 'root'@'%';
DROP DATABASE IF EXISTS test;

-- Administrative account vtcombo uses over the local socket.
CREATE USER 'vt_dba'@'localhost';
GRANT ALL PRIVILEGES ON *.* TO 'vt_dba'@'localhost' WITH GRANT OPTION;

-- Account behind application queries sent to vtgate.
CREATE USER 'vt_app'@'localhost';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, RELOAD, PROCESS, FILE, REFERENCES, INDEX,
      ALTER, SHOW DATABASES, CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, REPLICATION CLIENT,
      CREATE VIEW, SHOW VIEW, CREATE ROUTINE, ALTER ROUTINE, CREATE USER, EVENT, TRIGGER
   ON *.* TO 'vt_app'@'localhost';

CREATE USER 'vt_appdebug'@'localhost';
GRANT SELECT, SHOW DATABASES, PROCESS ON *.* TO 'vt_appdebug'@'localhost';

-- Accounts used by VReplication / VStream (they read the binary log).
CREATE USER 'vt_allprivs'@'localhost';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, RELOAD, PROCESS, FILE, REFERENCES, INDEX,
      ALTER, SHOW DATABASES, CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, REPLICATION SLAVE,
      REPLICATION CLIENT, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, ALTER ROUTINE, CREATE USER,
      EVENT, TRIGGER
   ON *.* TO 'vt_allprivs'@'localhost';

CREATE USER 'vt_filtered'@'localhost';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, RELOAD, PROCESS, FILE, REFERENCES, INDEX,
      ALTER, SHOW DATABASES, CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, REPLICATION SLAVE,
      REPLICATION CLIENT, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, ALTER ROUTINE, CREATE USER,
      EVENT, TRIGGER
   ON *.* TO 'vt_filtered'@'localhost';

CREATE USER 'vt_repl'@'%';
GRANT REPLICATION SLAVE ON *.* TO 'vt_repl'@'%';

CREATE USER 'vt_monitoring'@'localhost';
GRANT SELECT, PROCESS, SUPER, REPLICATION CLIENT, RELOAD ON *.* TO 'vt_monitoring'@'localhost';

FLUSH PRIVILEGES;
