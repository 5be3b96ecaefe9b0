-- Unsharded keyspace of the local test/demo cluster.
CREATE TABLE product (
  sku VARBINARY(128) NOT NULL,
  description VARCHAR(255),
  price BIGINT,
  PRIMARY KEY (sku)
) ENGINE=InnoDB;
