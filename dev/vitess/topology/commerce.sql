-- Keyspace `commerce` of dev/vitess_topology.sh: unsharded, every table here at first.
-- `customer` and `corder` are moved to keyspace `customer` by MoveTables, which is then
-- resharded by hash(customer_id) (vschema_customer_sharded.json).
CREATE TABLE product (
  sku VARBINARY(128) NOT NULL,
  description VARCHAR(255),
  price BIGINT,
  PRIMARY KEY (sku)
) ENGINE=InnoDB;

CREATE TABLE customer (
  customer_id BIGINT NOT NULL,
  email VARCHAR(128),
  PRIMARY KEY (customer_id)
) ENGINE=InnoDB;

CREATE TABLE corder (
  order_id BIGINT NOT NULL,
  customer_id BIGINT NOT NULL,
  sku VARBINARY(128),
  price BIGINT,
  PRIMARY KEY (order_id)
) ENGINE=InnoDB;
